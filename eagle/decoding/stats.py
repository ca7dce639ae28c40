"""Per-call statistics of a generate call, and the budget that clips what a call emits."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


@dataclass
class GenerationStats:
    """Per-call statistics of one generate call (`EaModel.last_stats`).

    `accept_lengths[i]` = drafts accepted at verification step i plus the bonus token, before
    clipping at a stop condition; `new_tokens` counts the tokens actually returned, including
    the one sampled from the prefill, so tau = new_tokens / steps.
    """

    method: str
    prompt_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0  # target forwards after the prefill
    accept_lengths: list[int] = field(default_factory=list)  # drafts accepted + 1 (bonus)
    prefill_seconds: float = 0.0
    cached_tokens: int = 0  # prompt tokens whose KV rows came from the previous generation (prefix_cache=True)
    seconds: float = 0.0

    def emit(self, budget: TokenBudget, tokens: torch.Tensor, start: float) -> torch.Tensor:
        """The new tokens [n] the budget lets through ([m <= n]), counted, with the seconds since `start`."""
        out = budget.take(tokens)
        self.new_tokens += out.numel()
        self.seconds = time.perf_counter() - start
        return out

    @property
    def tau(self) -> float:
        """Mean tokens per target forward after the prefill (new_tokens / steps)."""
        return self.new_tokens / self.steps if self.steps else float("nan")

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else float("nan")

    def acceptance_by_depth(self) -> list[float]:
        """Fraction of steps that accepted the draft at depth d = 1, 2, ..."""
        if not self.accept_lengths:
            return []
        depth = max(self.accept_lengths) - 1
        n = len(self.accept_lengths)
        return [sum(a - 1 >= d for a in self.accept_lengths) / n for d in range(1, depth + 1)]


class TokenBudget:
    """Clips emitted tokens to max_new_tokens / max_length and stops after an EOS."""

    def __init__(self, left: int, eos_ids: set[int]):
        self.left, self.eos_ids, self.done = left, eos_ids, left <= 0

    def take(self, tokens: torch.Tensor) -> torch.Tensor:  # [n] -> [m <= n]
        tokens = tokens[: self.left]
        for i, t in enumerate(tokens.tolist()):
            if t in self.eos_ids:
                tokens, self.done = tokens[: i + 1], True
                break
        self.left -= tokens.numel()
        self.done = self.done or self.left <= 0
        return tokens
