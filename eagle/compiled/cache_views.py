"""NumPy views of a static KV cache's CPU tensors, for a compiled target's per-step bookkeeping.

    views = CacheViews.of(cache)        # None while the cache is not allocated yet
    views.seek(rows)                    # every layer's write position (StaticLayer's cumulative_length)
    views.move(past, [0, 2, 3])         # rows past + accepted to past.., in every layer's keys and values

Between two forwards a decode step sets 30 layers' write positions and, when the accepted path is not a prefix
of the tree's node order, moves a few rows in 60 key and value tensors. Through torch each of those is an op
call of ~2-20 µs from Python (a 30-layer seek ~50 µs, a move ~1.2 ms on a 2-core Zen 2); through NumPy views
made once per cache, a few µs and ~0.2 ms. The views share the tensors' memory: the compiled graphs see every
write. NumPy has no bf16, so 2-byte tensors are viewed as int16 (a move copies bits, so any 2-byte type is
moved exactly). A cache on an accelerator gets the same object over torch's ops, made once as well.
"""

from __future__ import annotations

import numpy as np
import torch

from eagle.decoding.kv_commit import move_rows


class CacheViews:
    """One cache's layers: keys and values [B, H, S, D] and write positions (0-d), as NumPy views on the CPU
    (`rows`, `lengths`), as the tensors themselves elsewhere (`rows` None)."""

    def __init__(self, cache, tensors: list[torch.Tensor], lengths: list[torch.Tensor]):
        self.cache, self.tensors, self._lengths = cache, tensors, lengths
        self._first = cache.layers[0].keys  # the tensor the views were made of (`fits`)
        on_cpu = all(t.device.type == "cpu" for t in tensors + lengths)
        self.rows = [_array(t) for t in tensors] if on_cpu else None
        self.lengths = [_array(t) for t in lengths] if on_cpu else None

    @classmethod
    def of(cls, cache) -> CacheViews | None:
        """The views of `cache`'s tensors, or None while one is not allocated yet (StaticLayer's lazy start)."""
        tensors = [t for layer in cache.layers for t in (layer.keys, layer.values)]
        if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
            return None
        return cls(cache, tensors, [layer.cumulative_length for layer in cache.layers])

    def fits(self, cache) -> bool:
        """Whether these are still views of `cache`'s tensors."""
        return cache is self.cache and cache.layers[0].keys is self._first

    def seek(self, rows: int) -> None:
        """Every layer's next forward writes at row `rows`."""
        if self.lengths is None:
            for length in self._lengths:
                length.fill_(rows)
            return
        for length in self.lengths:
            length[...] = rows

    def move(self, past: int, accepted: list[int]) -> None:
        """Rows past + accepted[i] to past + i in every tensor (the rows are gathered into a copy first, so
        sources and destinations may overlap)."""
        if self.rows is None:
            rows = torch.tensor(accepted, device=self.tensors[0].device)  # once for all 60 tensors
            for x in self.tensors:
                move_rows(x, past, rows)
            return
        src = np.asarray(accepted, dtype=np.int64) + past
        for x in self.rows:
            x[:, :, past:past + src.size] = x[:, :, src]


def _array(t: torch.Tensor) -> np.ndarray:
    """A NumPy view of t's memory (2-byte types as int16)."""
    t = t.detach()
    return (t.view(torch.int16) if t.dtype in (torch.bfloat16, torch.float16) else t).numpy()
