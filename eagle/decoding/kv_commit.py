"""Commit accepted tree rows into KV caches, in place.

After verification a full-attention layer of the target cache holds `past_len` committed rows
followed by one row per tree node. The accepted nodes (root first) are gathered to rows
past_len .. past_len+n-1 and the rest is cropped away. Source and destination overlap (node
i moves to row i' <= i), so the rows are gathered into a new tensor first (`index_select`)
and then written back.

A sliding-window layer (transformers' `DynamicSlidingWindowLayer`, Mistral, Gemma-2/3,
Qwen-2's upper layers) keeps only the last `sliding_window - 1` committed rows. The decoder
turns on its past recording (`prepare_cache`), so a verify forward appends all tree rows
instead of dropping the oldest; commit then gathers the accepted rows after the layer's own
kept rows, trims back to the window and sets its token count (`cumulative_length`), leaving
exactly what the layer would hold had it seen the accepted tokens one by one.

Interfaces relied on (transformers 5.x `cache_utils`): `DynamicCache.layers`, each layer's
`.keys` / `.values` [B, kvH, S, D], `is_sliding`, `sliding_window`, `cumulative_length` and
`activate_past_recording()`. The draft head's cache is a plain (keys, values) tuple.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


def move_rows(x: torch.Tensor, past_len: int, accepted: torch.Tensor) -> None:
    """Move rows past_len + accepted [n] of x [B, H, S, D] to past_len.. (in place; a static cache stops here)."""
    src = (past_len + accepted).to(device=x.device, dtype=torch.long)
    x[:, :, past_len : past_len + src.numel()] = x.index_select(2, src)  # index_select copies: no aliasing


def commit_rows(x: torch.Tensor, past_len: int, accepted: torch.Tensor) -> torch.Tensor:
    """`move_rows`, then crop x to past_len + n rows."""
    move_rows(x, past_len, accepted)
    return x[:, :, : past_len + accepted.numel()]


def prepare_cache(cache: DynamicCache) -> None:
    """Make sliding-window layers keep every row a forward appends until `commit_cache` trims them."""
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False):
            layer.activate_past_recording()


def commit_cache(cache: DynamicCache, past_len: int, accepted: torch.Tensor) -> None:
    """Keep the accepted tree rows of every layer of a DynamicCache (in place).

    past_len: committed tokens before the tree; accepted [n]: tree node indices, root first
    (empty: drop the tree's rows, as if the verify forward had not run)."""
    for layer in cache.layers:
        if not getattr(layer, "is_sliding", False):
            layer.keys = commit_rows(layer.keys, past_len, accepted)
            layer.values = commit_rows(layer.values, past_len, accepted)
            continue
        tree_rows = layer.cumulative_length - past_len  # appended by the verify forward (0 after a prefill)
        kept = layer.keys.shape[-2] - tree_rows  # committed rows the layer still holds
        window = layer.sliding_window - 1
        layer.keys = commit_rows(layer.keys, kept, accepted)[:, :, -window:]
        layer.values = commit_rows(layer.values, kept, accepted)[:, :, -window:]
        layer.cumulative_length = past_len + accepted.numel()
