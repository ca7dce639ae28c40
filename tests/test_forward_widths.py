"""`python -m evaluation.forward_widths` on a tiny target folder: one compiled graph per width, timed."""

import pytest

import eagle.compiled.graph_cache as graph_cache
from evaluation.forward_widths import LOWERINGS, main


def test_forward_widths_times_each_width_after_compiling_it(tiny_dir, capsys, monkeypatch):
    monkeypatch.setenv("EAGLE_MATMULS", "aten")  # main sets it: restored after the test
    result = main(["--base", str(tiny_dir), "--dtype", "float32", "--widths", "1,2", "--rounds", "2", "--reps", "2",
                   "--matmuls", "aten"])
    assert set(result) == {1, 2}
    assert all(r["compile_s"] > 0 and r["ms"] > 0 for r in result.values())
    assert "| 2 |" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["inputs", "eager", "template"])
def test_forward_widths_times_another_matmul_lowering(tiny_dir, capsys, monkeypatch, kind):
    """--matmuls compiles (or not) with other inductor options and reports the peak memory beside the times."""
    monkeypatch.setattr(graph_cache, "compile_options", graph_cache.compile_options)  # main replaces it
    monkeypatch.setenv("EAGLE_MATMULS", "aten")  # or sets this
    result = main(["--base", str(tiny_dir), "--dtype", "float32", "--widths", "1,2", "--rounds", "1", "--reps", "2",
                   "--matmuls", kind])
    assert all(r["ms"] > 0 for r in result.values())
    out = capsys.readouterr().out
    assert f'"matmuls": "{kind}"' in out and "peak resident memory" in out
    if kind == "inputs":
        assert graph_cache.compile_options is LOWERINGS["inputs"]
    if kind == "template":
        assert graph_cache.matmuls_policy() == "template"
