"""Plain decoding's target forwards: an eager step over HF's DynamicCache, or a one-token step
compiled with fixed shapes over a preallocated cache (`EaModel(compile=True)`).

    step = plain_step(target, compile=True)   # CompiledStep, or EagerStep when the target cannot compile
    logits = step.prefill(input_ids, 128)     # [V]: eager prefill, with room for 128 more tokens
    logits = step(token)                      # [V]: one forward of token [1]
    step.compile_seconds                      # compiled: the first calls of each cache size

Why the compiled step has this shape (docs/speed.md, `python -m evaluation.compiled_forward`):
on a CPU, a forward compiled with `fullgraph=True`, `dynamic=False` and inductor's `freezing`
ran 1.4× faster than the eager one, but only while its cache spans about the context: over a
1,024-row cache for a 224-token context the gain was gone. So the cache is sized in buckets of
256 · 2^i rows, from the prompt and the tokens asked for, and each bucket compiles once per
process (~35 s for SmolLM2-135M on 2 cores); later calls of that size reuse the graph.
Targets with sliding-window layers keep the eager step (`compilable`): their static layers
hold a window, not the bucket.
"""

from __future__ import annotations

import time

import torch
import torch._inductor.config as inductor
from torch import nn
from transformers import DynamicCache, StaticCache

BUCKET = 256  # rows of the smallest cache


def bucket(rows: int) -> int:
    """The smallest 256 · 2^i >= rows."""
    size = BUCKET
    while size < rows:
        size *= 2
    return size


def compilable(target: nn.Module) -> bool:
    """Full attention in every layer (a static cache of one length serves them all)."""
    text = target.config.get_text_config()
    kinds = set(getattr(text, "layer_types", None) or ["full_attention"])
    return kinds == {"full_attention"} and getattr(text, "sliding_window", None) is None


class EagerStep:
    """HF's own decoding forwards: a DynamicCache that grows by one row a step."""

    compile_seconds = 0.0

    def __init__(self, target: nn.Module):
        self.target = target
        self.cache: DynamicCache | None = None

    def prefill(self, input_ids: torch.Tensor, room: int) -> torch.Tensor:
        self.cache = DynamicCache(config=self.target.config)
        return self.target(input_ids=input_ids, past_key_values=self.cache, use_cache=True).logits[0, -1]

    def __call__(self, token: torch.Tensor) -> torch.Tensor:
        return self.target(input_ids=token[None], past_key_values=self.cache, use_cache=True).logits[0, -1]


def plain_step(target: nn.Module, compile: bool) -> EagerStep | CompiledStep:
    return CompiledStep(target) if compile and compilable(target) else EagerStep(target)


class CompiledStep:
    """Plain decoding's target forwards: an eager prefill, then compiled one-token steps."""

    def __init__(self, target: nn.Module):
        self.target = target
        self.forward = torch.compile(target.forward, fullgraph=True, dynamic=False)
        self.compile_seconds = 0.0
        self._sizes: set[int] = set()  # cache sizes compiled in this process
        self._buffers: dict[int, tuple[StaticCache, torch.Tensor]] = {}  # per cache size, kept for the process
        self.cache: StaticCache | None = None
        self.mask: torch.Tensor | None = None  # [1, 1, 1, L] additive: 0 on the rows written so far
        self.pos = 0  # rows in the cache

    def prefill(self, input_ids: torch.Tensor, room: int) -> torch.Tensor:
        """Eager forward of the prompt [1, S] into the cache of its bucket, with room for `room` more
        tokens; [V] logits. One cache per size, reset and reused: with a new StaticCache per call, the
        second generation diverged from HF's (tests/test_plain_step.py) — the graph kept reading the
        cache it was compiled with, whose tensors HF marks as static addresses."""
        s = input_ids.shape[1]
        size = bucket(s + room)
        if size not in self._buffers:
            dtype = self.target.dtype
            mask = torch.empty((1, 1, 1, size), dtype=dtype, device=input_ids.device)
            self._buffers[size] = (StaticCache(config=self.target.config, max_cache_len=size), mask)
        self.cache, self.mask = self._buffers[size]
        self.cache.reset()
        self.mask.fill_(torch.finfo(self.mask.dtype).min)
        self.mask[..., :s] = 0
        out = self.target(input_ids=input_ids, past_key_values=self.cache, use_cache=True)
        self.pos = s
        return out.logits[0, -1]

    def __call__(self, token: torch.Tensor) -> torch.Tensor:
        """One token [1] at the next position; returns its logits [V] (the caller holds inference mode)."""
        if self.pos >= self.mask.shape[-1]:
            raise ValueError(f"the cache holds {self.mask.shape[-1]} rows: prefill with more room")
        self.mask[..., self.pos] = 0
        positions = torch.full((1, 1), self.pos, dtype=torch.long, device=token.device)  # [1, 1]
        size = self.mask.shape[-1]
        start = time.perf_counter()
        with inductor.patch(freezing=True):  # weights as graph constants: prepacked matmuls on a CPU
            out = self.forward(input_ids=token.view(1, 1), position_ids=positions, cache_position=positions[0],
                               attention_mask=self.mask, past_key_values=self.cache, use_cache=True)
        if size not in self._sizes:  # this call compiled the graph of this size
            self._sizes.add(size)
            self.compile_seconds += time.perf_counter() - start
        self.pos += 1
        return out.logits[0, -1]
