"""Grouped-query attention of a compiled forward: the query heads of a key/value head as its rows.

HF's `sdpa` attention, given a mask (our compiled forwards always give one), repeats each
key/value head for its g query heads (`repeat_kv`) before calling SDPA: in a compiled graph
that is a copy of the whole cache bucket per layer. And PyTorch's CPU flash kernel takes a
slow path for a single query in bf16: one layer of SmolLM2-135M (9 query / 3 key-value
heads, 2 threads) over 512 rows took 290 µs for 1 query against 96 µs for 2.

`grouped_attention` reshapes the query [B, H, r, D] to [B, Hk, g·r, D]: the g heads of a
group become g·r rows of its key/value head, each under its token's mask row. No key or value
is copied and a one-token step is 3 rows. A compiled one-token forward of the embedded default
went from 22.1 to 16.7 ms (2 threads); 8- and 16-row tree forwards did not change (27.8 and
34.8 ms against 28.2 and 35.0). Measured alternatives are in docs/speed.md.

`install_grouped_sdpa()` puts a thin wrapper in front of HF's registered `sdpa` function:
calls that pass `eagle_grouped=True` (only our compiled forwards do) take our C++ kernel where it
applies (eagle/compiled/attention_kernel.py: a CPU, once built), else this path; every other call, and
any call with softcapping, sinks or a sliding window, runs HF's own function.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from eagle.compiled import attention_kernel

GROUPED = "eagle_grouped"  # the keyword our compiled forwards pass down to the attention layers
_UNSUPPORTED = ("softcap", "sinks", "s_aux", "sliding_window", "position_bias")  # HF's function handles these


def grouped_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """query [B, H, r, D] over key/value [B, Hk, L, D] under the additive mask [B or 1, 1, r, L];
    returns [B, r, H, D] (the layout HF's attention functions return)."""
    b, h, r, d = query.shape
    groups = h // key.shape[1]
    rows = query.reshape(b, key.shape[1], groups * r, d)  # the heads of a group, one after another
    mask = mask.repeat(1, 1, groups, 1)  # [., 1, g·r, L]: each head's rows under the same pattern
    out = F.scaled_dot_product_attention(rows, key, value, attn_mask=mask, scale=scale)
    return out.reshape(b, h, r, d).transpose(1, 2).contiguous()


def same_length(key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor) -> None:
    """While a graph traces: a layer's keys and values span the mask's columns. Each layer's cache tensors are
    marked dynamic on their own (eagle/compiled/target_graphs.py `mark_length`), so each would be a symbol of
    its own, passed into the graph as an int at every call; told they are equal, the tracer keeps one."""
    torch._check(key.shape[2] == mask.shape[-1])
    torch._check(value.shape[2] == mask.shape[-1])


def _wrap(hf_sdpa):
    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        ours = kwargs.pop(GROUPED, False)
        if not ours or attention_mask is None or dropout or any([kwargs.get(k) is not None for k in _UNSUPPORTED]):
            return hf_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        if torch.compiler.is_compiling():
            same_length(key, value, attention_mask)
        if attention_kernel.applies(query, key, attention_mask):
            return attention_kernel.masked_attention(query, key, value, attention_mask, scale), None
        return grouped_attention(query, key, value, attention_mask, scale), None

    attention.eagle_wraps = hf_sdpa
    return attention


def install_grouped_sdpa() -> None:
    """Route `sdpa` attention calls that carry `eagle_grouped=True` through `grouped_attention` (idempotent)."""
    current = ALL_ATTENTION_FUNCTIONS["sdpa"]
    if not hasattr(current, "eagle_wraps"):
        ALL_ATTENTION_FUNCTIONS.register("sdpa", _wrap(current))


def grouped_sdpa_applies(target: torch.nn.Module) -> bool:
    """Whether the target's layers attend through HF's `sdpa` (the function `install_grouped_sdpa` wraps)."""
    return target.config.get_text_config()._attn_implementation == "sdpa"
