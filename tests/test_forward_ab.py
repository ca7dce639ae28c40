"""experiments/forward_ab.py: a compiled target's forwards with one of our changes and without it (sibling weights
joined; graphs called directly; the GEMM template's epilogue fusion off; our GEMV; a dynamic cache length; one
length symbol; pointwise loops on one thread), timed in one process, on a tiny model."""

from __future__ import annotations

import os

import pytest
import torch

from eagle.common.native_build import cpu_flags
from eagle.compiled import gemv
from experiments import forward_ab
from tests.tiny import tiny_llama


@pytest.mark.skipif("avx512_bf16" not in cpu_flags(), reason="the GEMV kernel needs AVX512-BF16")
@pytest.mark.parametrize("change", ["joined", "direct"])
def test_forwards_with_and_without_a_change_are_timed_side_by_side(monkeypatch, capsys, change):
    monkeypatch.setenv("EAGLE_GEMV", "1")
    monkeypatch.setattr(forward_ab, "resolve_target", lambda base: base)
    monkeypatch.setattr(forward_ab, "load_target", lambda path, dtype: tiny_llama(seed=5, dtype=torch.bfloat16))
    monkeypatch.setattr(forward_ab, "PROMPT", 12)
    result = forward_ab.main([change, "--threads", str(torch.get_num_threads()), "--rows", "3", "--rounds", "1"])
    assert set(result) == {"plain", "verify 3"}
    assert all(r["with_ms"] > 0 and r["without_ms"] > 0 and r["ratio"] > 0 for r in result.values())
    assert "outputs equal bit for bit" in capsys.readouterr().out


@pytest.mark.parametrize("change", ["epilogue", "length", "symbols", "serial"])
def test_fp32_graphs_with_and_without_a_compile_time_change_are_timed_side_by_side(monkeypatch, capsys, change):
    """`epilogue`: fp32 graphs whose matmuls take the GEMM template, compiled with our options and with the
    template's epilogue fusion on. `length`: our graphs (the cache length dynamic) against graphs of the 256-row
    bucket alone. `symbols`: our graphs against graphs traced with a length symbol per cache tensor. `serial`: graphs
    whose pointwise loops never fork the OpenMP team against ours. Same bits,
    and what our graphs compile with is ours again after."""
    monkeypatch.setenv("EAGLE_MATMULS", "template")
    monkeypatch.setattr(forward_ab, "resolve_target", lambda base: base)
    monkeypatch.setattr(forward_ab, "load_target", lambda path, dtype: tiny_llama(seed=5, dtype=dtype))
    monkeypatch.setattr(forward_ab, "PROMPT", 12)
    result = forward_ab.main([change, "--dtype", "float32", "--threads", str(torch.get_num_threads()),
                              "--rows", "3", "--rounds", "1"])
    assert set(result) == {"plain", "verify 3"} and "outputs equal bit for bit" in capsys.readouterr().out
    assert forward_ab.graph_cache.compile_options is forward_ab.OURS
    assert forward_ab.OURS()["epilogue_fusion"] is False
    assert forward_ab.target_graphs._mark_dynamic is forward_ab.DYNAMIC_LENGTH
    assert forward_ab.grouped_attention.same_length is forward_ab.SAME_LENGTH


@pytest.mark.skipif(not gemv.f32_capable(cpu_flags()), reason="the fp32 kind needs AVX512F or AVX2")
def test_graphs_with_and_without_the_gemv_are_timed_side_by_side(monkeypatch, capsys):
    """`gemv`: fp32 graphs over bf16-valued weights through the kernel's fp32 kind against `EAGLE_GEMV=0` ones;
    the outputs agree to rounding, and the process's EAGLE_GEMV is what it was after."""
    monkeypatch.setattr(gemv, "cpu_flags", lambda: set(gemv.F32_FLAGS))
    monkeypatch.setenv("EAGLE_GEMV", "auto")
    monkeypatch.setattr(forward_ab, "resolve_target", lambda base: base)
    monkeypatch.setattr(forward_ab, "load_target", lambda path, dtype: tiny_llama(seed=5, dtype=torch.bfloat16).float())
    monkeypatch.setattr(forward_ab, "PROMPT", 12)
    result = forward_ab.main(["gemv", "--dtype", "float32", "--threads", str(torch.get_num_threads()),
                              "--rows", "3", "--rounds", "1"])
    assert set(result) == {"plain", "verify 3"} and "outputs" in capsys.readouterr().out
    assert os.environ["EAGLE_GEMV"] == "auto"

