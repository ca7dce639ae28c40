"""experiments/joined_siblings.py: a compiled target's forwards with sibling weights joined and apart, timed in
one process, on a tiny model."""

from __future__ import annotations

import pytest
import torch

from eagle.common.native_build import cpu_flags
from experiments import joined_siblings
from tests.tiny import tiny_llama


@pytest.mark.skipif("avx512_bf16" not in cpu_flags(), reason="the GEMV kernel needs AVX512-BF16")
def test_joined_and_apart_forwards_are_timed_side_by_side(monkeypatch, capsys):
    monkeypatch.setenv("EAGLE_GEMV", "1")
    monkeypatch.setattr(joined_siblings, "resolve_target", lambda base: base)
    monkeypatch.setattr(joined_siblings, "load_target", lambda path, dtype: tiny_llama(seed=5, dtype=torch.bfloat16))
    monkeypatch.setattr(joined_siblings, "PROMPT", 12)
    result = joined_siblings.main(["--threads", str(torch.get_num_threads()), "--rows", "3", "--rounds", "1"])
    assert set(result) == {"plain", "verify 3"}
    assert all(r["joined_ms"] > 0 and r["apart_ms"] > 0 and r["ratio"] > 0 for r in result.values())
    assert "outputs equal bit for bit" in capsys.readouterr().out
