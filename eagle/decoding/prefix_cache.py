"""The KV rows of the last generation, kept for the next prompt that starts with its tokens (`prefix_cache=True`).

A chat's next prompt is its previous prompt, the reply and a new message. With `prefix_cache=True` a generation
ends by copying its caches' rows out of the runners (`KeptRows.of`) and the next one, through the same
`EaModel`, prefills only the tokens after their common prefix (`reusable`), as llama.cpp's and vLLM's servers
do. The compiled runners give copies (other decoders of the target, the tuner or a background compile may
overwrite their buffers in between); the eager ones views of caches no later call writes.

Row t of the target's cache holds token ids[t]; row t of the head's holds (f_t, ids[t+1]), so it is valid
only while ids[t+1] is shared too:

    ids     x0 x1 x2 x3 x4          kept: L = 4 rows each (x4, the root, is in neither cache)
    prompt  x0 x1 x2 y3 ...         common prefix P = 3
    reused  target rows 0..1, head rows 0..1 (Q = P - 1 = 2); the prefill runs x2 y3 ... after them

A prompt equal to the kept tokens still prefills its last token (its logits pick the first new one).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KVRows = tuple[torch.Tensor, torch.Tensor]  # (keys, values) [1, kvH, rows, D] of one layer


@dataclass
class KeptRows:
    """A finished generation's tokens and the rows of its caches, taken out of the runners."""

    ids: torch.Tensor  # [L + 1] its tokens: prompt and generated, the last (the root) in neither cache
    target: list[KVRows]  # per target layer, L rows
    head: KVRows | None  # L rows of the draft head's cache; None after plain decoding

    @classmethod
    def of(cls, ids: torch.Tensor, target_runner, target_cache, head_runner=None, head_past=None) -> KeptRows | None:
        """The rows of tokens ids [L + 1] (all but the last) in a state's caches, taken out of their runners
        (eagle/decoding/runners.py `rows`); None where the target's runner cannot give them (a sliding window)."""
        n = ids.numel() - 1
        target = target_runner.rows(target_cache, n)
        if target is None:
            return None
        return cls(ids.clone(), target, None if head_past is None else head_runner.rows(head_past, n))

    @property
    def rows(self) -> int:
        return self.target[0][0].shape[2]

    def reusable(self, prompt: torch.Tensor, head: bool) -> int:
        """How many leading rows a prefill of prompt [S] may take from here: rows of the common prefix whose
        tokens (and, for the head's rows, next tokens) are shared, leaving at least the prompt's last token."""
        if head and self.head is None:
            return 0
        shared = common_prefix(self.ids, prompt.to(self.ids.device))
        return max(0, min(shared - 1 if head else shared, prompt.numel() - 1, self.rows))

    def target_rows(self, n: int) -> list[KVRows]:
        """The first n rows of every target layer."""
        return [(k[:, :, :n], v[:, :, :n]) for k, v in self.target]

    def head_rows(self, n: int) -> KVRows:
        """The first n rows of the head's cache."""
        keys, values = self.head
        return keys[:, :, :n], values[:, :, :n]


def reusable(kept: KeptRows | None, prompt: torch.Tensor, head: bool) -> int:
    """`KeptRows.reusable`, 0 without kept rows."""
    return 0 if kept is None else kept.reusable(prompt, head)


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the longest common prefix of token ids a [m] and b [n]."""
    n = min(a.numel(), b.numel())
    differs = (a[:n] != b[:n]).nonzero()
    return int(differs[0, 0]) if differs.numel() else n
