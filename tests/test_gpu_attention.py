"""The draft head's attention under training-time test (train/unroll.py) on grouped-KV heads.

On a GPU, PyTorch's SDPA dispatcher sends a call with an attention mask away from flash attention
(no masks) and a call with `enable_gqa=True` away from the memory-efficient kernel (no grouped
heads), so a masked grouped call lands on the math kernel, which keeps fp32 scores
[B, heads, S, (i+1)·S] of every unrolled pass until the backward. This machine has no GPU (the CPU
build has no memory-efficient kernel, and its flash kernel takes masks and groups alike), so the
tests record what the head passes to SDPA and apply the CUDA rule to each call (`cuda_kernel`),
and check that the path taken in training computes what the grouped call computes.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from eagle.heads.eagle2 import DraftConfig, DraftHead
from tests.tiny import random_eagle3_head, tiny_llama
from train.unroll import unrolled_forward


@dataclass
class SdpaCall:
    masked: bool
    enable_gqa: bool
    query_heads: int
    key_heads: int
    recorded_grad: bool  # autograd records the call (its inputs are saved for the backward)


def cuda_kernel(call: SdpaCall) -> str:
    """The kernel PyTorch's CUDA dispatcher can give a bf16 call of this head's shapes: flash attention
    takes no mask, the memory-efficient kernel no `enable_gqa`; the math kernel takes anything."""
    if not call.masked:
        return "flash"
    if not call.enable_gqa:
        return "efficient"
    return "math"


@pytest.fixture
def sdpa_calls(monkeypatch):
    calls: list[SdpaCall] = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        calls.append(SdpaCall(attn_mask is not None, enable_gqa, q.shape[-3], k.shape[-3],
                              torch.is_grad_enabled() and q.requires_grad))
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                    enable_gqa=enable_gqa)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return calls


def grouped_head(kind: str):
    """(a tiny head with 4 query and 2 key/value heads, the width of its committed-row inputs)."""
    target = tiny_llama(0)
    if kind == "eagle3":
        head = random_eagle3_head(target, layers=(0, 1, 2), seed=1)
        return head, 3 * head.config.hidden_size
    torch.manual_seed(1)
    return DraftHead(DraftConfig.from_target_config(target.config)), target.config.hidden_size


def inputs(width: int, hidden: int, b: int = 2, s: int = 11, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    feats, embeds = torch.randn(b, s, width, generator=g), torch.randn(b, s, hidden, generator=g)
    return feats, embeds, torch.arange(s).expand(b, -1)


@pytest.mark.parametrize("kind", ["eagle2", "eagle3"])
def test_no_unrolled_pass_reaches_the_math_kernel(kind, sdpa_calls):
    head, width = grouped_head(kind)
    assert head.config.num_key_value_heads < head.config.num_attention_heads  # grouped KV heads
    head.train()
    feats, embeds, pos = inputs(width, head.config.hidden_size)
    outs = unrolled_forward(head, feats, embeds, pos, steps=4, detach=kind == "eagle2")
    sum(o.float().pow(2).mean() for o in outs).backward()
    assert len(sdpa_calls) == 4 and sdpa_calls[0].masked is False
    kernels = [cuda_kernel(c) for c in sdpa_calls]
    assert "math" not in kernels, f"pass kernels on a GPU: {kernels} ({sdpa_calls})"


@pytest.mark.parametrize("kind", ["eagle2", "eagle3"])
def test_the_training_path_equals_the_grouped_call(kind, sdpa_calls):
    """The unrolled passes with gradients (keys and values given per query head) give the outputs of
    the grouped call the decoder makes without gradients, bit for bit on this CPU."""
    head, width = grouped_head(kind)
    feats, embeds, pos = inputs(width, head.config.hidden_size, seed=2)
    with torch.no_grad():
        grouped = unrolled_forward(head, feats, embeds, pos, steps=4)
    assert all(c.enable_gqa for c in sdpa_calls if c.masked)  # decoding: the grouped call, unchanged
    sdpa_calls.clear()
    trained = unrolled_forward(head, feats, embeds, pos, steps=4)
    assert all(c.recorded_grad and not c.enable_gqa for c in sdpa_calls if c.masked)
    for a, b in zip(grouped, trained):
        assert torch.equal(a, b.detach())


def test_gradients_equal_those_of_the_same_head_with_repeated_key_value_heads():
    """A grouped head is a full multi-head head whose key/value projections repeat per group: its
    unrolled loss has that head's gradients, the group's key/value gradients summed."""
    head, width = grouped_head("eagle3")
    cfg = head.config
    rep = cfg.num_attention_heads // cfg.num_key_value_heads
    full_cfg = DraftConfig(**{**vars(cfg), "num_key_value_heads": cfg.num_attention_heads})
    full = type(head)(full_cfg)
    state = dict(head.state_dict())
    for name in ("k_proj", "v_proj"):
        w = state[f"midlayer.self_attn.{name}.weight"]  # [kvH*D, 2H]
        state[f"midlayer.self_attn.{name}.weight"] = w.view(cfg.num_key_value_heads, cfg.head_dim, -1) \
            .repeat_interleave(rep, dim=0).reshape(-1, w.shape[-1])
    full.load_state_dict(state)
    feats, embeds, pos = inputs(width, cfg.hidden_size, seed=3)
    for model in (head, full):
        outs = unrolled_forward(model, feats, embeds, pos, steps=3, detach=False)
        sum(0.8 ** i * o.pow(2).mean() for i, o in enumerate(outs)).backward()
    for name, p in head.named_parameters():
        g = dict(full.named_parameters())[name].grad
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            g = g.view(cfg.num_key_value_heads, rep, cfg.head_dim, -1).sum(1).reshape(p.shape)
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6, msg=name)
