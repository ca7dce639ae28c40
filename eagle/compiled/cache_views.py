"""NumPy views of a static KV cache's CPU tensors, for a compiled target's per-step bookkeeping.

    views = CacheViews.of(cache)        # None where a tensor is off the CPU or not allocated yet
    views.seek(rows)                    # every layer's write position (StaticLayer's cumulative_length)
    views.move(past, [0, 2, 3])         # rows past + accepted to past.., in every layer's keys and values

Between two forwards a decode step sets 30 layers' write positions and, when the accepted path is not a prefix
of the tree's node order, moves a few rows in 60 key and value tensors. Through torch each of those is an op
call of ~2-20 µs from Python (a 30-layer seek ~50 µs, a move ~1.2 ms on a 2-core Zen 2); through NumPy views
made once per cache, a few µs and ~0.2 ms. The views share the tensors' memory: the compiled graphs see every
write. NumPy has no bf16, so 2-byte tensors are viewed as int16 (a move copies bits, so any 2-byte type is
moved exactly).
"""

from __future__ import annotations

import numpy as np
import torch


class CacheViews:
    """NumPy views of one cache's layers: keys and values [B, H, S, D] and write positions (0-d)."""

    def __init__(self, cache, rows: list[np.ndarray], lengths: list[np.ndarray]):
        self.cache, self.rows, self.lengths = cache, rows, lengths
        self._first = cache.layers[0].keys  # the tensor the views were made of (`fits`)

    @classmethod
    def of(cls, cache) -> CacheViews | None:
        """Views of `cache`'s tensors, or None where one is not a CPU tensor yet (lazily allocated, or on an
        accelerator: the caller keeps torch's ops)."""
        tensors = [t for layer in cache.layers for t in (layer.keys, layer.values)]
        lengths = [layer.cumulative_length for layer in cache.layers]
        if not tensors or not all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in tensors + lengths):
            return None
        return cls(cache, [_array(t) for t in tensors], [_array(t) for t in lengths])

    def fits(self, cache) -> bool:
        """Whether these are still views of `cache`'s tensors."""
        return cache is self.cache and cache.layers[0].keys is self._first

    def seek(self, rows: int) -> None:
        """Every layer's next forward writes at row `rows`."""
        for length in self.lengths:
            length[...] = rows

    def move(self, past: int, accepted: list[int]) -> None:
        """Rows past + accepted[i] to past + i in every tensor (the rows are gathered into a copy first, so
        sources and destinations may overlap)."""
        src = np.asarray(accepted, dtype=np.int64) + past
        for x in self.rows:
            x[:, :, past:past + src.size] = x[:, :, src]


def _array(t: torch.Tensor) -> np.ndarray:
    """A NumPy view of t's memory (2-byte types as int16)."""
    t = t.detach()
    return (t.view(torch.int16) if t.dtype in (torch.bfloat16, torch.float16) else t).numpy()
