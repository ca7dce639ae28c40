"""`DecodeState`: everything one decode step reads and writes, passed explicitly between steps.
Its two caches are the runners' own (eagle/decoding/runners.py); the decoder only passes them back."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from eagle.compiled.head_graphs import HeadRows
from eagle.compiled.target_graphs import CompiledTarget
from eagle.heads.eagle2 import KVCache

HeadPast = KVCache | HeadRows  # the head runner's cache: eager, its tensors; compiled, rows of a fixed buffer
TargetCache = DynamicCache | CompiledTarget  # the target runner's cache: eager, HF's; compiled, the runner itself


@dataclass
class DecodeState:
    """What one decode step needs; `ids[-1]` is the root, in neither KV cache yet."""

    ids: torch.Tensor  # [1, L] committed tokens (prompt + generated)
    target_cache: TargetCache  # L-1 rows, as the target runner's prefill made it (eagle/decoding/runners.py)
    head_past: HeadPast  # L-1 rows; row t encodes (f_t, x_{t+1})
    draft_hidden: torch.Tensor  # [1, H] head output of row L-2: f̂_{L-1}, drafts x_L
    draft_logp: torch.Tensor  # [1, Vd] fp32, CPU: the draft's log-probs of x_L (the scorer over draft_hidden)

    @property
    def committed(self) -> int:
        """Rows in each KV cache (= position id of the root)."""
        return self.ids.shape[1] - 1

    @property
    def root(self) -> torch.Tensor:
        """The root token [1] (on the CPU, where trees are built)."""
        return self.ids[0, -1:].cpu()
