"""The draft head's eager forward and scorer (eagle/decoding/runners.py `HeadRunner`): the head's
cache is its (keys, values) tensors, which every call extends into new tensors."""

from __future__ import annotations

import torch
from torch import nn

from eagle.common.forward_lock import one_forward
from eagle.decoding.tree import additive_mask, causal_mask
from eagle.heads.draft_vocab import DraftVocabulary
from eagle.heads.eagle2 import KVCache


class EagerHead:
    """A head and its draft vocabulary's scorer, run as they are."""

    def __init__(self, head: nn.Module, vocab: DraftVocabulary):
        self.head, self.vocab = head, vocab

    def start(self, past: KVCache) -> KVCache:
        """A prompt's head cache is the state's as it is."""
        return past

    def rows(self, past: KVCache, n: int) -> KVCache:
        """The first n rows of a state's head cache (views: no call writes into it)."""
        keys, values = past
        return keys[:, :, :n], values[:, :, :n]

    def encode(self, embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
               allowed: torch.Tensor | None, past: KVCache | None,
               scored: int = 0) -> tuple[torch.Tensor, torch.Tensor | None, KVCache]:
        """Head rows (embeds [m, H], features [m, F]) at positions [m] over `past`'s P rows (None: none);
        allowed [m, P+m] bool (CPU, None: causal). Outputs [m, H], the draft log-probs [scored, Vd]
        (fp32, CPU) of the last `scored` rows (0: None) and the cache with the m rows."""
        mask = None
        if past is not None or allowed is not None:
            mask = causal_mask(embeds.shape[0], past[0].shape[2], embeds.dtype) if allowed is None else \
                additive_mask(allowed, embeds.dtype)
            mask = mask.to(embeds.device)
        with one_forward():  # not beside another thread's compile (eagle/common/forward_lock.py)
            hidden, past = self.head(features[None], embeds[None], positions[None], mask, past)
            logp = self.vocab.logp(hidden[0, hidden.shape[1] - scored:]) if scored else None
        return hidden[0], logp, past
