"""experiments/decode_roofline.py: the kernels a batched decode step cannot skip, in the target's shapes."""

from __future__ import annotations

import pytest
import torch

from data_prep.slot_attention import slot_shape
from experiments import decode_roofline
from tests.tiny import tiny_llama


def test_the_linear_shapes_are_every_weight_a_decode_step_multiplies():
    model = tiny_llama(layers=3)
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    shapes = decode_roofline.linear_shapes(model.config)
    assert sum(k * o * count for k, o, count in shapes) == weights
    assert (model.config.hidden_size, model.config.vocab_size, 1) in shapes  # the lm_head, once a step


def test_attention_reads_every_cached_key_and_value_once_a_layer():
    config = tiny_llama(layers=3).config
    seconds, read = decode_roofline.attention_seconds(config, batch=2, context=5, dtype=torch.float32, rounds=1, kernel="bmm")
    per_layer = 2 * 2 * config.num_key_value_heads * 5 * slot_shape(config)[2] * 4  # K and V, fp32
    assert read == 3 * per_layer and seconds > 0


def test_every_timed_kernel_is_the_same_decode_attention():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 1, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)  # 4 query heads on 2 key heads
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # [B, H, 1, d]
    for name, attend in decode_roofline.KERNELS.items():
        out = attend(q, k, v)
        out = out.transpose(1, 2) if name == "grouped_sdpa" else out  # the decoder's kernel returns HF's [B, 1, H, d]
        torch.testing.assert_close(out, expected, msg=name)


def test_the_gemv_kernel_multiplies_as_torch_where_the_cpu_has_bf16_pairs():
    """experiments/gemv_roofline.py's kernel: 1-4 rows, outputs not a multiple of its 16-row blocks."""
    if "avx512_bf16" not in open("/proc/cpuinfo").read():
        pytest.skip("the kernel needs AVX512-BF16")
    from experiments import gemv_roofline

    kernel = gemv_roofline.gemv_kernel()
    torch.manual_seed(0)
    for rows, inputs, outputs in ((1, 64, 16), (2, 96, 37), (3, 32, 5), (4, 128, 130)):
        x = torch.randn(rows, inputs, dtype=torch.bfloat16)
        w = torch.randn(outputs, inputs, dtype=torch.bfloat16)
        expected = torch.nn.functional.linear(x.float(), w.float())
        torch.testing.assert_close(kernel.gemv(x, w).float(), expected, rtol=0.02, atol=0.1)
    with pytest.raises(RuntimeError, match="1-4 rows"):
        kernel.gemv(torch.zeros(5, 32, dtype=torch.bfloat16), torch.zeros(8, 32, dtype=torch.bfloat16))
