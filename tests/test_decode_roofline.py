"""experiments/decode_roofline.py: the kernels a batched decode step cannot skip, in the target's shapes."""

from __future__ import annotations

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


def test_joined_siblings_are_the_same_weights_in_four_calls_a_layer():
    from experiments import gemv_roofline

    model = tiny_llama(layers=3)
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    siblings = gemv_roofline.sibling_weights(model.config)
    assert sum(w.numel() for w in siblings) == weights
    assert len(siblings) == 4 * 3 + 1


def test_a_step_of_weights_runs_every_weight_in_either_layout():
    from experiments import gemv_roofline

    weights = [torch.randn(6, 16), torch.randn(4, 8).reshape(2, 1, 2, 2, 4)]  # [O, I], packed [O/2, I/8, 2, 2, 4]
    seen = []
    gemv_roofline.step_ms(weights, 3, lambda x, w: seen.append((x.shape, x.dtype)), 1, torch.float32)
    assert seen[-2:] == [((3, 16), torch.float32), ((3, 8), torch.float32)]


def test_attention_reads_every_cached_key_and_value_once_a_layer():
    config = tiny_llama(layers=3).config
    seconds, read = decode_roofline.attention_seconds(config, batch=2, context=5, dtype=torch.float32, rounds=1, kernel="bmm")
    per_layer = 2 * 2 * config.num_key_value_heads * 5 * slot_shape(config)[2] * 4  # K and V, fp32
    assert read == 3 * per_layer and seconds > 0
    _, half = decode_roofline.attention_seconds(config, 2, 5, torch.float32, 1, kernel=decode_roofline.BF16_CACHE)
    assert half == read // 2  # fp32 rows over a bf16 cache


def test_every_timed_kernel_is_the_same_decode_attention():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 1, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)  # 4 query heads on 2 key heads
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # [B, H, 1, d]
    for name, attend in decode_roofline.KERNELS.items():
        out = attend(q, k, v)
        out = out.transpose(1, 2) if name == "grouped_sdpa" else out  # the decoder's kernel returns HF's [B, 1, H, d]
        torch.testing.assert_close(out, expected, msg=name)

