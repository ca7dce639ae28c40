"""Attention over a slot KV cache: each reply of our batched engine (data_prep/batched_decoding.py) owns one slot.

    cache = SlotCache(model.config, slots=256, length=1024, dtype=torch.bfloat16, device="cpu")
    with slot_attention(model):                       # the target's layers attend through this file
        model(input_ids=ids, position_ids=positions, eagle_slots=cache.rows(slots, positions[0]))  # [1, N]; [N]

A step is one sequence of N rows, each a token in a slot of its own: a reply's next token, or a prompt's
tokens (several rows of one slot at consecutive positions). Every row first writes its key and value at its
position in its slot, then attends over its slot's positions up to its own, so a prompt's tokens see
each other causally and a reply sees its whole context. On a CPU this runs our C++ kernel
(data_prep/csrc/slot_attention.cpp, built at first use into the torch extensions cache, 1-1.5 min): it
reads each slot's keys and values once for all the query heads that share them, where torch's kernels
(SDPA, matmuls) spend 3-5x longer on one-query rows (135M target, 128 slots over 512 positions, 2
threads: 1.5 ms a layer against 5.3 for two batched matmuls). Elsewhere, or when the kernel cannot be
built, `reference_decode` does the same in torch.

The target's attention function is switched only inside `slot_attention(model)`; HF's modeling code is
used as it is (its rotary embeddings at our positions, then this function instead of its own).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from eagle.common.native_build import optional_extension

log = logging.getLogger("data_prep")
NAME = "eagle_slots"  # the attention implementation this file registers
KWARG = "eagle_slots"  # the keyword a forward passes its SlotCall with
SOURCE = Path(__file__).resolve().parent / "csrc" / "slot_attention.cpp"


@cache
def kernel():
    """The attention kernel's extension, or None where it cannot be built."""
    log.info("ours: loading the attention kernel (%s; built at a machine's first use, 1-1.5 min)", SOURCE.name)
    return optional_extension("eagle_slot_attention", SOURCE, log, "decoding with torch's kernels")


def reference_decode(q, k, v, k_cache, v_cache, slots, lengths, scale: float, window: int = 0,
                     softcap: float = 0.0) -> torch.Tensor:
    """What the C++ kernel computes, in torch: q [B, H, D], k and v [B, Hk, D] -> [B, H, D]. Every row's key and
    value are written (in the caches' dtype) before any row attends."""
    b, h, d = q.shape
    positions = lengths - 1  # [B]
    k_cache[slots, :, positions] = k.to(k_cache.dtype)
    v_cache[slots, :, positions] = v.to(v_cache.dtype)
    span = int(lengths.max())
    keys, values = k_cache[slots, :, :span], v_cache[slots, :, :span]  # [B, Hk, L, D]
    index = torch.arange(span, device=q.device)
    visible = index < lengths[:, None]  # [B, L]
    if window:
        visible &= index >= (lengths - window)[:, None]
    rows = q.view(b, keys.shape[1], h // keys.shape[1], d).float()  # [B, Hk, G, D]
    scores = (rows @ keys.float().transpose(-1, -2)) * scale  # [B, Hk, G, L]
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~visible[:, None, None], float("-inf"))
    return (scores.softmax(-1) @ values.float()).reshape(b, h, d).to(q.dtype)


@torch.library.custom_op("eagle::slot_decode", mutates_args=("k_cache", "v_cache"))
def slot_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                slots: torch.Tensor, lengths: torch.Tensor, scale: float, window: int, softcap: float) -> torch.Tensor:
    """One decode step over the slot cache (an op of its own, so that a compiled step calls it as it is):
    the C++ kernel on a CPU, else `reference_decode`."""
    native = kernel() if q.device.type == "cpu" else None
    step = native.slot_decode if native is not None else reference_decode
    return step(q, k, v, k_cache, v_cache, slots, lengths, scale, window, softcap)


@slot_decode.register_fake
def _(q, k, v, k_cache, v_cache, slots, lengths, scale, window, softcap):
    return torch.empty_like(q)


@dataclass
class SlotCall:
    """One step's rows: the slot of each [N] and the positions each attends over, its own included [N]."""

    cache: "SlotCache"
    slots: torch.Tensor
    lengths: torch.Tensor


def slot_shape(config) -> tuple[int, int, int]:
    """(layers, key/value heads, head size) of a target's config."""
    text = config.get_text_config()
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    return text.num_hidden_layers, kv_heads, getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads


def slot_bytes(config, length: int, dtype: torch.dtype) -> int:
    """Bytes of one slot's keys and values over `length` positions."""
    layers, kv_heads, head_dim = slot_shape(config)
    return 2 * layers * kv_heads * length * head_dim * torch.finfo(dtype).bits // 8


class SlotCache:
    """Keys and values of `slots` replies, `length` positions each: per layer [slots, Hk, length, D]."""

    def __init__(self, config, slots: int, length: int, dtype: torch.dtype, device):
        layers, kv_heads, head_dim = slot_shape(config)
        shape = (slots, kv_heads, length, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.bytes = slots * slot_bytes(config, length, dtype)

    def rows(self, slots: torch.Tensor, positions: torch.Tensor) -> SlotCall:
        """A step whose row i is at `positions[i]` of slot `slots[i]` (both [N])."""
        return SlotCall(self, slots, positions + 1)


def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """HF's attention-function signature over one sequence of N rows: query [1, H, N, D], key and value
    [1, Hk, N, D] -> [1, N, H, D]; the forward's `eagle_slots` SlotCall places the rows."""
    call: SlotCall = kwargs[KWARG]
    if kwargs.get("sinks") is not None or kwargs.get("s_aux") is not None:
        raise NotImplementedError(f"{type(module).__name__}: the batched reply engine does not attend with "
                                  "sinks; use data.regen.engine=vllm")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    window = int(kwargs.get("sliding_window") or 0)
    layer, cache = module.layer_idx, call.cache
    rows = lambda x: x[0].transpose(0, 1).contiguous()  # [1, heads, N, D] -> [N, heads, D]
    out = slot_decode(rows(query), rows(key), rows(value), cache.keys[layer], cache.values[layer], call.slots,
                      call.lengths, scale, window, float(kwargs.get("softcap") or 0.0))
    return out[None], None


def _no_mask(*args, **kwargs):
    return None  # the attention function builds its own from the SlotCall


@contextmanager
def slot_attention(model):
    """The target's layers attend through `attention` inside this block, through their own function after."""
    ALL_ATTENTION_FUNCTIONS.register(NAME, attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, _no_mask)
    config = model.config.get_text_config()
    before = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = before
