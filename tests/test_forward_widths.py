"""`python -m evaluation.forward_widths` on a tiny target folder: one compiled graph per width, timed."""

from evaluation.forward_widths import main


def test_forward_widths_times_each_width_after_compiling_it(tiny_dir, capsys):
    result = main(["--base", str(tiny_dir), "--dtype", "float32", "--widths", "1,2", "--rounds", "2", "--reps", "2"])
    assert set(result) == {1, 2}
    assert all(r["compile_s"] > 0 and r["ms"] > 0 for r in result.values())
    assert "| 2 |" in capsys.readouterr().out
