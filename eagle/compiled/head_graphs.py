"""The draft head at fixed shapes (`EaModel(compile=True)`): a preallocated head KV cache and
compiled forwards of the head with the draft vocabulary's scorer over its outputs.

    runner = CompiledHead(head, scorer)
    past = runner.start(kv)                                   # a prompt's head cache (eager prefill), copied in
    hidden, logp, past = runner.encode(embeds, features, positions, allowed, past, scored)   # one compiled call

These are the `HeadRunner` methods (eagle/decoding/runners.py) the eager head has too
(eagle/decoding/eager_head.py); a state's `head_past` is then `HeadRows`, not the head's tensors.

Why (docs/speed.md): eager, the head's forward is ~40 small ops and the scorer three more. Inside a
decode step (SmolLM2-135M, bf16, 2 threads) the head's update took 2.07 ms and the scorer 1.14;
compiled with the target's settings (freezing; GEMM templates) 0.97 + ~0.3 of
padding and mask, and ~0.9-1.1. Both are bound by reading their weights (8.4 and 14 MB), which the
target's forward has just pushed out of the caches: warm, the same calls take 0.6 and 0.2 ms. Each
compiled call also costs a fixed ~0.3-0.8 ms beyond its weights (the frame, the C++ wrapper, its
parallel regions), so the scorer runs inside the head's graph: a head call returns the draft log-probs
its caller needs next (all rows while drafting, the last row at a commit), and a step makes two
calls of the head instead of four.

- **Buffer.** keys and values [1, layers*kvH, L, D], L = 256 · 2^i (eagle.compiled.target_graphs.bucket),
  one per prompt. A decode state holds `HeadRows(length)`: the buffer's first `length` rows. Drafted
  nodes are written after them and overwritten by the next commit, so a state's rows never change.
- **Fixed widths.** A call of m rows is padded to the next power of two; padded rows attend to
  themselves only and land past the real ones, where no later mask looks.
- **Graphs:** one per (rows, feature width, scored rows) for every buffer length (L is a dynamic
  dimension of the mask, keys and values; an EAGLE-3 head reads 3H-wide target features at the
  root, its own H-wide states deeper; the scorer reads all `rows`, the last row, or none), compiled
  at the first call (a few seconds each, inductor's cache in a second process);
  `compile_seconds` sums those first calls. Under `defer` a shape without a graph runs eagerly and
  compiles between generations (`pending`, `prepare`: eagle/tuning/compile_ahead.py). Later calls
  of a shape run its graph's code without dynamo's lookup (eagle/compiled/direct_call.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from eagle.compiled import direct_call, gemv, sibling_weights
from eagle.compiled.graph_cache import compiled_call, threads_match
from eagle.compiled.target_graphs import bucket, mark_length, padded_mask
from eagle.heads.draft_vocab import draft_log_probs
from eagle.heads.eagle2 import KVCache

log = logging.getLogger("eagle")
ROOM = 64  # rows a new buffer holds beyond the prompt (a step's drafts and accepted tokens)


@dataclass(frozen=True)
class HeadRows:
    """A decode state's head cache under a `CompiledHead`: the first `length` rows of its buffer."""

    length: int


class CompiledHead:
    """A head's compiled forward and scorer, and its preallocated KV buffer (a `HeadRunner`). One
    generation at a time."""

    def __init__(self, head: nn.Module, scorer: nn.Module):
        self.head, self.scorer = head, scorer
        sibling_weights.join(head, gemv.reads)  # its layer's q/k/v and gate/up: one GEMV call each in the graphs
        self._forward = torch.compile(self._head_rows, fullgraph=True, dynamic=False)
        self._scored = torch.compile(self._scored_rows, fullgraph=True, dynamic=False)
        self._eager = {self._forward: self._head_rows, self._scored: self._scored_rows}  # each graph's eager code
        self._direct: dict[tuple, object] = {}  # shape -> its graph's code (eagle/compiled/direct_call.py), or None
        self.compile_seconds = 0.0  # the first calls of each shape, summed
        self.shapes: set[tuple] = set()  # ("head", rows, feature width, scored rows) compiled so far
        self.threads = torch.get_num_threads()  # the model's: its graphs compile and run at it (threads_match)
        self.defer = False  # True: a shape not compiled yet runs eagerly and waits in `missing` (see `prepare`)
        self.missing: set[tuple] = set()  # head shapes run eagerly, to compile between generations
        self.embed_width = 0  # H of the token embeddings the head reads (set at the first call)
        self._picks: dict[tuple, torch.Tensor] = {}  # (rows, m, scored, device) -> the rows scored (`_picked`)
        self.keys: torch.Tensor | None = None  # [1, layers*kvH, L, D]
        self.values: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return self.keys.shape[2]

    def start(self, past: KVCache) -> HeadRows:
        """Copy a prompt's head cache ([1, C, S, D] each) into a new buffer of bucket(S + ROOM) rows."""
        keys, values = past
        s, size = keys.shape[2], bucket(keys.shape[2] + ROOM)
        self.keys, self.values = _resized(keys, s, size), _resized(values, s, size)
        return HeadRows(s)

    def rows(self, past: HeadRows, n: int) -> KVCache:
        """Copies of the first n rows of the buffer (the next generation writes it)."""
        return self.keys[:, :, :n].clone(), self.values[:, :, :n].clone()

    def encode(self, embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
               allowed: torch.Tensor | None, past: HeadRows,
               scored: int = 0) -> tuple[torch.Tensor, torch.Tensor | None, HeadRows]:
        """Head rows (token embeddings [m, H], features [m, F]) at positions [m] after `past`'s rows;
        allowed [m, P+m] bool: the rows each attends to (None: causal). Returns outputs [m, H], the draft
        log-probs [scored, Vd] (fp32, CPU) of the last `scored` rows (0: None) and the rows with the m new ones."""
        m, p = embeds.shape[0], past.length
        rows = _padded(m)
        if p + rows > self.size:
            size = bucket(p + rows)
            self.keys, self.values = _resized(self.keys, p, size), _resized(self.values, p, size)
        device = embeds.device
        mask = self._mask(allowed, p, m, rows, embeds.dtype).to(device)  # [1, 1, rows, L]
        if rows > m:
            embeds, features = _pad_rows(embeds, rows), _pad_rows(features, rows)
            positions = torch.cat([positions, positions.new_full((rows - m,), p)])
        else:  # the graphs run without guards (direct_call.py): dense rows, as they were compiled for
            embeds, features = embeds.contiguous(), features.contiguous()
        cache_rows = torch.arange(p, p + rows, device=device)
        self.embed_width = embeds.shape[1]
        args = (embeds, features, positions, mask, self.keys, self.values, cache_rows)
        if not scored:
            hidden = self._call(("head", rows, features.shape[1], 0), self._forward, *args)
            return _first(hidden, m), None, HeadRows(p + m)
        picked = self._picked(rows, m, scored, device)
        hidden, logp = self._call(("head", rows, features.shape[1], picked.numel()), self._scored, *args, picked)
        return _first(hidden, m), _first(logp, scored).cpu(), HeadRows(p + m)

    def _picked(self, rows: int, m: int, scored: int, device: torch.device) -> torch.Tensor:
        """The rows [r] a call of m real rows (padded to `rows`) scores: its last `scored`, or all `rows` when
        every real row is scored (padding's too: one graph per width). Made once per kind of call."""
        key = (rows, m, scored, device)
        if key not in self._picks:
            self._picks[key] = (torch.arange(rows) if scored == m else torch.arange(m - scored, m)).to(device)
        return self._picks[key]

    def commit_shapes(self, most: int, width: int) -> list[tuple]:
        """The shapes of a commit (the accepted tokens' rows, target features `width` wide, the last row scored)
        of 1..`most` rows, padded as `encode` pads them."""
        return [("head", 1 << i, width, 1) for i in range(_padded(most).bit_length())]

    def pending(self) -> list[tuple]:
        """Head shapes that ran eagerly, to compile before the next generation."""
        return sorted(self.missing - self.shapes)

    def prepare(self, shape: tuple) -> None:
        """Compile one ("head", rows, feature width, scored rows) shape by a call on zeros (its own
        buffers: the decode state's rows stay as they are)."""
        _, rows, width, scored = shape
        size = self.size
        keys = self.keys.new_zeros(*self.keys.shape[:2], size, self.keys.shape[3])  # [1, C, L, D]
        embeds = keys.new_zeros(rows, self.embed_width)  # [rows, H]
        features = keys.new_zeros(rows, width)  # [rows, F]
        positions = torch.zeros(rows, dtype=torch.long, device=keys.device)  # [rows]
        mask = keys.new_zeros(1, 1, rows, size)  # [1, 1, rows, L]
        cache_rows = torch.arange(rows, device=keys.device)  # [rows]
        args = (embeds, features, positions, mask, keys, keys.clone(), cache_rows)
        if scored:
            self._call(shape, self._scored, *args, torch.arange(scored, device=keys.device), compile_now=True)
        else:
            self._call(shape, self._forward, *args, compile_now=True)
        self.missing.discard(shape)

    def _call(self, shape: tuple, fn, *args, compile_now: bool = False) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """fn(*args) through its graph for `shape`, compiled with the target's settings (keyed by the head's
        and scorer's weights: eagle/compiled/graph_cache.py; on AVX2 CPUs reading them as int8, a draft's
        approximation: eagle/compiled/gemv.py `int8_drafts`) at the shape's first call; under `defer` (and not
        compile_now) a shape not compiled yet runs eagerly and joins `missing`."""
        compiling = shape not in self.shapes
        if not threads_match(self.threads):
            return self._eager[fn](*args)
        if compiling and self.defer and not compile_now:
            self.missing.add(shape)
            return self._eager[fn](*args)
        direct = self._direct.get(shape)
        if direct is not None:  # its graph, without dynamo's lookup
            return direct(*args)
        _, _, _, mask, keys, values, *_ = args
        for t, dim in ((mask, 3), (keys, 2), (values, 2)):  # the buffer's length: one graph for every bucket
            mark_length(t, dim)
        if compiling:
            log.info("compiling the draft's %s for shape %s (once per process)", shape[0], shape[1:])
        start = time.perf_counter()
        with compiled_call(compiling, self.head, self.scorer, threads=self.threads, draft=True):
            before = direct_call.graphs(self._eager[fn]) if compiling else set()
            out = fn(*args)
            if compiling:
                self._direct[shape] = direct_call.newest(self._eager[fn], before)
        if compiling:
            self.shapes.add(shape)
            self.compile_seconds += time.perf_counter() - start
        return out

    def _head_rows(self, embeds, features, positions, mask, keys, values, cache_rows):  # [R, H] x2 -> [R, H]
        hidden, _ = self.head(features[None], embeds[None], positions[None], mask, (keys, values), cache_rows)
        return hidden[0]

    def _scored_rows(self, embeds, features, positions, mask, keys, values, cache_rows, picked):
        """The head's rows [R, H] and the draft log-probs [r, Vd] (fp32) of its rows `picked` [r]."""
        hidden = self._head_rows(embeds, features, positions, mask, keys, values, cache_rows)
        return hidden, draft_log_probs(self.scorer, hidden.index_select(0, picked))

    def _mask(self, allowed: torch.Tensor | None, p: int, m: int, rows: int, dtype: torch.dtype) -> torch.Tensor:
        """[1, 1, rows, L] additive: `allowed` [m, p+m] (None: causal) over the first p+m rows (padded_mask)."""
        if allowed is None:  # the p rows before and the m new ones causally
            return padded_mask(np.tri(m, dtype=bool), rows, self.size, dtype, past=p)
        return padded_mask(allowed, rows, self.size, dtype)


def _padded(m: int) -> int:
    """The next power of two >= m: the widths the head compiles for."""
    return 1 << max(0, m - 1).bit_length()


def _first(x: torch.Tensor, n: int) -> torch.Tensor:
    """x's first n rows (x itself when it has n)."""
    return x if x.shape[0] == n else x[:n]


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x [m, W] with zero rows up to [rows, W]."""
    return torch.cat([x, x.new_zeros(rows - x.shape[0], x.shape[1])])


def _resized(cache: torch.Tensor, keep: int, size: int) -> torch.Tensor:
    """A new [B, C, size, D] buffer holding the first `keep` rows of cache [B, C, *, D]."""
    out = cache.new_zeros(*cache.shape[:2], size, cache.shape[3])
    out[:, :, :keep] = cache[:, :, :keep]
    return out
