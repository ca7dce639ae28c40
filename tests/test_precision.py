"""Which dtype batched forwards run in (eagle/common/precision.py), on CPUs with and without bf16 arithmetic."""

import logging

import pytest
import torch

from eagle.common import precision


@pytest.mark.parametrize("avx512_bf16, amx, expected", [(False, False, torch.float32), (True, False, torch.bfloat16),
                                                        (False, True, torch.bfloat16)])
def test_bf16_runs_in_fp32_only_on_a_cpu_without_bf16_arithmetic(monkeypatch, caplog, avx512_bf16, amx, expected):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    with caplog.at_level(logging.INFO, logger="eagle"):
        assert precision.fast_dtype("bfloat16", "cpu") == expected
    assert ("no bf16 arithmetic" in caplog.text) == (expected == torch.float32)
    assert precision.fast_dtype(torch.float32, "cpu") == torch.float32  # fp32 and fp16 are kept as asked
    assert precision.fast_dtype("float16", "cpu") == torch.float16


def test_a_gpu_answers_for_itself(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert precision.fast_dtype(torch.bfloat16, "cuda") == torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert precision.fast_dtype(torch.bfloat16, "cuda:3") == torch.bfloat16


def test_auto_asks_for_bf16(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert precision.fast_dtype("auto") == torch.bfloat16
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert precision.fast_dtype("auto") == torch.float32
