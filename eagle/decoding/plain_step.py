"""Plain decoding's target forwards: an eager step over HF's DynamicCache, or a one-token step
compiled with fixed shapes over a bucketed static cache (`EaModel(compile=True)`,
eagle/compiled/target_graphs.py).

    step = plain_step(target, compile=True)   # CompiledStep, or EagerStep when the target cannot compile
    logits = step.prefill(input_ids)          # [V]: the prompt's last logits
    logits = step(token)                      # [V]: one forward of token [1]
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache

from eagle.compiled.target_graphs import CompiledTarget, compilable


class EagerStep:
    """HF's own decoding forwards: a DynamicCache that grows by one row a step."""

    def __init__(self, target: nn.Module):
        self.target = target
        self.cache: DynamicCache | None = None

    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.cache = DynamicCache(config=self.target.config)
        return self.target(input_ids=input_ids, past_key_values=self.cache, use_cache=True).logits[0, -1]

    def __call__(self, token: torch.Tensor) -> torch.Tensor:
        return self.target(input_ids=token[None], past_key_values=self.cache, use_cache=True).logits[0, -1]


class CompiledStep:
    """An eager prefill, then compiled one-token forwards (one graph per cache bucket)."""

    def __init__(self, target: nn.Module):
        self.runner = CompiledTarget.of(target)
        self.pos = 0  # rows in the cache

    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.pos = input_ids.shape[1]
        return self.runner.prefill(input_ids, room=1, hidden=False).logits[0, -1]

    def __call__(self, token: torch.Tensor) -> torch.Tensor:
        """One token [1] at the next position; its logits [V] (the caller holds inference mode)."""
        positions = torch.full((1,), self.pos, dtype=torch.long, device=token.device)  # [1]
        out = self.runner.forward(token, positions, torch.ones(1, 1, dtype=torch.bool), self.pos, 1, hidden=False)
        self.pos += 1
        return out.logits[0, -1]


def plain_step(target: nn.Module, compile: bool) -> EagerStep | CompiledStep:
    return CompiledStep(target) if compile and compilable(target) else EagerStep(target)
