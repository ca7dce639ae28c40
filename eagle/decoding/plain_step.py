"""Plain decoding (`naivegenerate`, and `eagenerate` at a one-node tree): one target forward per token
through the decoder's target runner (eagle/decoding/runners.py), eager or compiled.

    step = PlainStep(runner)          # EaModel.plain
    logits = step.prefill(input_ids)  # [V]: the prompt's last logits
    logits = step(token)              # [V]: one forward of token [1]
"""

from __future__ import annotations

import torch

from eagle.decoding.prefix_cache import KVRows
from eagle.decoding.runners import TargetRunner


class PlainStep:
    """A runner's one-token forwards, with the cache and position of the generation under way."""

    def __init__(self, runner: TargetRunner):
        self.runner = runner
        self.cache: object | None = None  # from the runner's plain_prefill
        self.pos = 0  # rows in the cache

    def prefill(self, input_ids: torch.Tensor, reused: list[KVRows] | None = None) -> torch.Tensor:
        """A new generation from the prompt [1, S], its first rows taken from `reused` (eagle/decoding/prefix_cache.py);
        its last logits [V]."""
        logits, self.cache = self.runner.plain_prefill(input_ids, reused)
        self.pos = input_ids.shape[1]
        return logits

    def __call__(self, token: torch.Tensor) -> torch.Tensor:
        """One token [1] at the next position; its logits [V] (the caller holds inference mode)."""
        logits = self.runner.plain_step(self.cache, token, self.pos)
        self.pos += 1
        return logits
