"""The draft vocabulary: the target tokens a head may propose. One home for trainer, exporter and decoder.

The target verifies every draft, so restricting the draft to a subset of the vocabulary never
changes the output; it only shrinks the draft's `lm_head` work (on a CPU its largest cost).

- **Ids.** `[N]` target ids, most frequent first for heads this project trains
  (`ranked_ids` over training-token counts). An EAGLE-3 head's list is exactly its lm_head's
  rows; an EAGLE-1/2 head's selects rows of the target's lm_head. None = the whole vocabulary.
- **Stored** in EAGLE-3's two tensors (`stored_tensors` / `ids_from_stored`): `d2t [N]` int64
  offsets (target id of draft id i = i + d2t[i]) and `t2d [V]` bool (which target ids are in it),
  draft ids in **ascending target-id order**, as SpecForge, EAGLE's EAGLE-3 trainer and
  speculators assume; the frequency order travels separately as `draft_rank [N]` (the
  in-memory position of each stored draft id), so "the N most frequent" still works. Heads
  stored without `draft_rank` (the authors', and ours of older versions) load in their stored order.
- **Narrowed** (`narrow`): a head's first N tokens, with an EAGLE-3 head's rows of them.
- **Topped up** (`top_up`): a list, then another's ids it lacks. Fine-tuning keeps its starting
  head's tokens beyond the store's; `train.vocab_choice --keep` keeps a head's list first; the decoder's
  `draft_vocab=N` beyond a head's list adds the target's other tokens.
- **Scored** (`DraftVocabulary`): the module that turns head outputs into draft log-probs over
  the vocabulary, and the map from draft indices back to target ids.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

STORED_KEYS = ("d2t", "t2d", "draft_rank")
LARGE_VOCAB = 65536  # a target vocabulary above this gets a draft vocabulary by default
LARGE_VOCAB_DRAFT = 32768  # its size (EAGLE-3 uses 32k for Llama-3's 128k)


# ---- choosing ---------------------------------------------------------------------------------


def ranked_ids(counts: torch.Tensor, size: int | None = None, seen_only: bool = True) -> torch.Tensor:
    """Token ids by descending count [V] (ties by id), at most `size`. [N] long

    seen_only: drop tokens never counted; otherwise exactly `size` ids (an EAGLE-3 lm_head
    has a fixed number of rows), unseen ones last by id."""
    order = torch.sort(-counts, stable=True).indices
    if seen_only:
        order = order[: int((counts > 0).sum())]
    return order[:size] if size else order


def draft_vocab_size(configured: int | None, vocab_size: int) -> int | None:
    """train.draft_vocab, or, when unset, 32,768 for a vocabulary over 65,536 (a 256k-token
    Gemma would otherwise make every draft step and token loss pay for the whole lm_head)."""
    if configured is not None:
        return configured
    return LARGE_VOCAB_DRAFT if vocab_size > LARGE_VOCAB else None


def top_up(ids: torch.Tensor, extra: torch.Tensor | None, size: int | None) -> torch.Tensor:
    """`ids`, then the ids of `extra` it lacks (in `extra`'s order) until there are `size` (all of
    them when `size` is None). [M] long"""
    if extra is None or (size and ids.numel() >= size):
        return ids
    missing = extra[~torch.isin(extra, ids)]
    return torch.cat([ids, missing[: size - ids.numel() if size else None].to(ids.dtype)])


def narrow(head: nn.Module, size: int) -> None:
    """Keep only a head's first `size` draft tokens (the most frequent, for heads this project trains), in
    place: an EAGLE-3 head keeps their lm_head rows, so it drafts as `draft_vocab=size` makes it draft at
    decode time, from a smaller file (`python -m train.publish --draft-vocab N`)."""
    ids = head.draft_ids
    if ids is None or not 0 < size <= ids.numel():
        held = "the whole vocabulary" if ids is None else f"{ids.numel()} tokens"
        raise ValueError(f"draft_vocab={size}: the head drafts over {held}; keep between 1 and all of its own list")
    if head.config.architecture == "eagle3":
        head.lm_head = _rows(head.lm_head, torch.arange(size))
        head.config.draft_vocab_size = size
    head.draft_ids = ids[:size].clone()


def coverage(counts: torch.Tensor, sizes: Iterable[int]) -> dict[int, float]:
    """Fraction of counted tokens inside the top-N ids, for each N."""
    ranked = torch.sort(counts, descending=True).values.cumsum(0).double()
    total = float(ranked[-1]) or 1.0
    return {n: float(ranked[min(n, ranked.numel()) - 1]) / total for n in sizes}


# ---- storing ----------------------------------------------------------------------------------


def stored_tensors(ids: torch.Tensor, vocab_size: int) -> dict[str, torch.Tensor]:
    """`d2t` [N] (ascending target ids), `t2d` [V] and `draft_rank` [N] for the ids [N] in their
    in-memory (frequency) order. Stored draft id j is in-memory entry `draft_rank[j]`: an EAGLE-3
    head's lm_head rows are stored in that order too (`eagle.heads.checkpoint`)."""
    ids = ids.to("cpu", torch.int64)
    if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size or ids.unique().numel() != ids.numel():
        raise ValueError(f"a draft vocabulary needs distinct target ids in [0, {vocab_size})")
    order = torch.argsort(ids)  # [N] in-memory index of each stored (ascending) draft id
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return {"d2t": ids[order] - torch.arange(ids.numel()), "t2d": t2d, "draft_rank": order}


def ids_from_stored(state: dict[str, torch.Tensor], where: Path | str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(target ids [N] in their in-memory order, or None when the head stores no vocabulary;
    the stored draft id of each in-memory entry [N], or None when stored order is the order)."""
    if "d2t" not in state:
        return None, None
    ids = state["d2t"].to(torch.int64) + torch.arange(state["d2t"].numel())
    if "t2d" in state and int(state["t2d"].sum()) != ids.numel():
        raise ValueError(f"{where}: d2t ({ids.numel()} ids) and t2d ({int(state['t2d'].sum())} ids) disagree")
    if "draft_rank" not in state:
        return ids, None
    rank = state["draft_rank"].to(torch.int64)
    if not torch.equal(torch.sort(rank).values, torch.arange(ids.numel())):
        raise ValueError(f"{where}: draft_rank is not a permutation of the {ids.numel()} draft ids")
    stored_of = torch.argsort(rank)  # [N] stored draft id of in-memory entry i
    return ids[stored_of], stored_of


# ---- scoring (the decoder) --------------------------------------------------------------------


def draft_log_probs(scorer: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """Draft log-probs [m, Vd] (fp32, on hidden's device) of head outputs [m, H]: the eager and the compiled
    head score through this one formula."""
    return scorer(hidden).float().log_softmax(dim=-1)


@dataclass
class DraftVocabulary:
    """What the decoder drafts over: `scorer` maps head outputs [m, H] to logits [m, Vd]; `ids`
    [Vd] maps draft indices to target ids (None: draft index = target id)."""

    ids: torch.Tensor | None
    scorer: nn.Module

    @classmethod
    def of(cls, head: nn.Module, lm_head: nn.Linear, size: int | None = None) -> "DraftVocabulary":
        """A head's vocabulary, drafting through `lm_head` (the target's) or, EAGLE-3, its own.

        size: only the first `size` ids of the head's stored list (the most frequent, for heads
        this project trains); an EAGLE-1/2 head asked for more than it stores gets the target's
        other ids after them (size = the target's vocabulary size: all of it)."""
        eagle3 = head.config.architecture == "eagle3"
        ids = head.draft_ids
        if size is not None:
            if ids is None:
                raise ValueError("draft_vocab needs a head with a stored draft vocabulary "
                                 "(python -m train.vocab_choice STORE --head DIR)")
            if size > ids.numel() and eagle3:
                raise ValueError(f"draft_vocab={size}: this EAGLE-3 head's lm_head has only {ids.numel()} rows")
            if size >= lm_head.out_features:
                return cls(None, nn.Sequential(lm_head))
            ids = top_up(ids.cpu(), torch.arange(lm_head.out_features), size)[:size]
        if eagle3:
            rows = head.lm_head if size is None else _rows(head.lm_head, torch.arange(ids.numel()))
            return cls(None if ids is None else ids.to("cpu", torch.long), nn.Sequential(_Scorer(head), rows))
        if ids is None:
            return cls(None, nn.Sequential(lm_head))
        ids = ids.to("cpu", torch.long)
        return cls(ids, nn.Sequential(_rows(lm_head, ids)))

    @property
    def size(self) -> int:
        """How many tokens the draft scores (Vd)."""
        return self.scorer[-1].out_features

    def logp(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft log-probs [m, Vd] (fp32, on the CPU) of head outputs [m, H]."""
        return draft_log_probs(self.scorer, hidden).cpu()

    def to_target(self, draft_tokens: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary indices -> target token ids (same shape)."""
        return draft_tokens if self.ids is None else self.ids[draft_tokens]


class _Scorer(nn.Module):
    """What an EAGLE-3 head's lm_head reads of a state (eagle/heads/eagle3.py `scorer_norm`)."""

    def __init__(self, head: nn.Module):
        super().__init__()
        self.norm = head.norm
        self.normed = bool(head.config.norm_output)  # forward's output is already norm(a_t)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden if self.normed else self.norm(hidden)


def _rows(linear: nn.Linear, ids: torch.Tensor) -> nn.Linear:
    """A frozen Linear holding the output rows `ids` [N] of `linear`."""
    rows = nn.Linear(linear.in_features, ids.numel(), bias=linear.bias is not None)
    rows = rows.to(device=linear.weight.device, dtype=linear.weight.dtype).requires_grad_(False)
    index = ids.to(linear.weight.device)
    rows.weight.copy_(linear.weight[index])
    if linear.bias is not None:
        rows.bias.copy_(linear.bias[index])
    return rows
