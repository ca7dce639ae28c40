"""experiments/forward_ab.py: a compiled target's forwards with one of our changes and without it (sibling weights
joined; graphs called directly), timed in one process, on a tiny model."""

from __future__ import annotations

import pytest
import torch

from eagle.common.native_build import cpu_flags
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
