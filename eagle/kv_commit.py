"""Commit accepted tree rows into KV caches, in place.

After verification the target cache holds `past_len` committed rows followed by one row per
tree node. The accepted nodes (root first) are gathered to rows past_len .. past_len+n-1 and
the rest is cropped away. Source and destination overlap (node i moves to row i' <= i), so
the rows are gathered into a new tensor first (`index_select`) and then written back.

Works on transformers 5.x `DynamicCache` (full-attention layers with `.keys` / `.values`
of shape [B, kvH, S, D]) and on the draft head's plain (keys, values) tuple.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


def commit_rows(x: torch.Tensor, past_len: int, accepted: torch.Tensor) -> torch.Tensor:
    """Move rows past_len + accepted [n] of x [B, H, S, D] to past_len.. and crop to past_len + n."""
    n = accepted.numel()
    src = (past_len + accepted).to(device=x.device, dtype=torch.long)
    x[:, :, past_len : past_len + n] = x.index_select(2, src)  # index_select copies: no aliasing
    return x[:, :, : past_len + n]


def commit_cache(cache: DynamicCache, past_len: int, accepted: torch.Tensor) -> None:
    """Keep the accepted tree rows of every layer of a DynamicCache (in place)."""
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False):
            raise NotImplementedError("sliding-window cache layers are not supported by the tree commit")
        layer.keys = commit_rows(layer.keys, past_len, accepted)
        layer.values = commit_rows(layer.values, past_len, accepted)

