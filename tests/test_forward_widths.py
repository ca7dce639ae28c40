"""`python -m evaluation.forward_widths` on a tiny target folder: the compiled widths timed, and beside
them (`--static`) a static graph per width."""

import pytest

import eagle.compiled.graph_cache as graph_cache
from evaluation.forward_widths import LOWERINGS, main


def test_forward_widths_times_each_width_after_compiling_it(tiny_dir, capsys, monkeypatch):
    monkeypatch.setenv("EAGLE_MATMULS", "aten")  # main sets it: restored after the test
    result = main(["--base", str(tiny_dir), "--dtype", "float32", "--widths", "1,2,3", "--rounds", "2", "--reps", "2",
                   "--matmuls", "aten", "--static"])
    assert set(result) == {1, 2, 3}
    assert all(r["ms"] > 0 for r in result.values()) and result[1]["compile_s"] > 0 and result[2]["compile_s"] > 0
    assert result[3]["compile_s"] < result[2]["compile_s"] / 4  # width 3 runs width 2's graph
    assert "static_ms" not in result[1] and all(result[w]["static_ms"] > 0 for w in (2, 3))
    out = capsys.readouterr().out
    assert "| 3 |" in out and "dynamic ÷ static" in out


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
