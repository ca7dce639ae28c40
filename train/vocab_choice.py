"""Which draft vocabulary a training run uses and stores (the policy; eagle/heads/draft_vocab.py is the format).

Counting happens over the tokens the draft has to predict in training: the assistant tokens
(loss mask) of the feature store's training records.

- EAGLE-1/2: every token the store holds, most frequent first, topped up with the tokens of
  the starting head (`train.init_head`) the store lacks, so a fine-tune on a small store keeps
  its start's vocabulary; with `train.keep_init_vocab` the starting head's list comes first, in
  its order (the next slice of the same corpus: the head keeps drafting the tokens it was chosen
  for). The token loss runs over the first `train.draft_vocab` of them (the whole lm_head when
  unset); the head stores those (every listed token when unset, for the decoder's `draft_vocab=N` later).
- EAGLE-3: exactly its lm_head's rows, the `train.draft_vocab` most frequent tokens (unseen ones
  last by id); none when that is the whole vocabulary. A fine-tune keeps its starting head's
  ids: row i of the lm_head it starts from scores that head's i-th draft token, so another
  ranking would hand its rows to tokens they never scored. A widened fine-tune (an lm_head of
  the target's rows, train/head_init.py) adds the store's most frequent other tokens after them.

    python -m train.vocab_choice STORE_DIR [STORE_DIR ...] [--head HEAD_DIR] [--size N] [--keep]

prints the coverage of the top-N tokens and, with --head, writes the vocabulary into that
head's checkpoint; --keep tops the head's own vocabulary up instead of replacing it.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from data_prep.store import FeatureStore
from eagle.heads.checkpoint import load_head, write_draft_vocab
from eagle.heads.draft_vocab import coverage, ranked_ids, stored_tensors, top_up

log = logging.getLogger("train")
def token_counts(store: FeatureStore, indices: Iterable[int] | None = None, vocab_size: int | None = None) -> torch.Tensor:
    """How often each token id occurs under the loss mask of the given records. [V] int64"""
    vocab_size = vocab_size or int(store.manifest["target"]["vocab_size"])
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for i in range(len(store)) if indices is None else indices:
        input_ids, loss_mask = store.tokens(i)  # the features are never read
        counts += torch.bincount(input_ids[loss_mask], minlength=vocab_size)
    return counts


@dataclass
class TrainingVocabulary:
    """The draft vocabulary of one run: `ids` [N] target ids (None = the whole vocabulary) and the
    `size` the token loss uses (train.draft_vocab; None = all)."""

    ids: torch.Tensor | None
    size: int | None
    eagle3: bool
    coverage: float = 1.0  # share of the training tokens inside the first `size` ids

    @classmethod
    def choose(cls, counts: torch.Tensor, size: int | None, eagle3: bool, draft_rows: int | None = None,
               start: torch.Tensor | None = None, keep_start: bool = False) -> "TrainingVocabulary":
        """counts [V] of the training tokens; draft_rows: an EAGLE-3 head's lm_head rows; start: the
        starting head's stored ids (fine-tuning), kept first by an EAGLE-1/2 head with keep_start."""
        if eagle3 and start is not None:
            ids = start  # the starting lm_head's rows score these tokens, in this order
            log.info("draft vocabulary: the %d tokens of train.init_head", ids.numel())
            if draft_rows > start.numel():  # widened (train/head_init.py): the store's most frequent others after them
                ids = top_up(start, ranked_ids(counts, seen_only=False), draft_rows)
                log.info("draft vocabulary: %d more, the store's most frequent others", ids.numel() - start.numel())
        elif eagle3:
            ids = ranked_ids(counts, draft_rows, seen_only=False) if draft_rows < counts.numel() else None
        elif keep_start and start is not None:
            ids = top_up(start, ranked_ids(counts), None)
            log.info("draft vocabulary: the %d tokens of train.init_head first", start.numel())
        else:
            seen = ranked_ids(counts)
            ids = top_up(seen, start, size)
            if ids.numel() > seen.numel():
                log.info("draft vocabulary: the store sees %d tokens; %d more come from train.init_head",
                         seen.numel(), ids.numel() - seen.numel())
        used = None if ids is None or not size else ids[:size]
        share = 1.0 if used is None else float(counts.double()[used].sum() / counts.double().sum().clamp(min=1))
        if used is not None:
            log.info("draft vocabulary: %d of %d tokens, covering %.4f of the training tokens", used.numel(),
                     counts.numel(), share)
        return cls(ids, size, eagle3, share)

    def stored(self) -> torch.Tensor | None:
        """The ids exported with the head: EAGLE-3, its lm_head's rows; EAGLE-1/2, the first `size`."""
        if self.eagle3 or self.ids is None:
            return self.ids
        return self.ids[: self.size or None]

    def loss_rows(self, lm_head: torch.Tensor) -> torch.Tensor:
        """The frozen lm_head [V, H], or its rows of the first `size` ids: the EAGLE-1/2 token loss
        and its softmax run over these rows only. [Vd, H]"""
        if not self.size or self.ids is None:
            return lm_head
        return lm_head[self.ids[: self.size].to(lm_head.device)].contiguous()

    def eagle3_target(self, vocab_size: int, device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(draft ids [Vd], membership [V] bool) on `device` for the EAGLE-3 token loss; None = all."""
        if self.ids is None:
            return None
        return self.ids.to(device), stored_tensors(self.ids, vocab_size)["t2d"].to(device)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stores", nargs="+", help="feature store directories (their counts add up)")
    ap.add_argument("--head", help="head directory to write the vocabulary into")
    ap.add_argument("--size", type=int, default=None, help="keep at most N ids (default: every seen token)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the head's own vocabulary first and add the stores' most frequent other tokens")
    args = ap.parse_args(argv)
    counts = sum(token_counts(FeatureStore(s)) for s in args.stores)
    for n, c in coverage(counts, (1024, 2048, 4096, 8192, 12288, 16384, 32768)).items():
        print(f"top {n:>6}: {c:.4f} of {int(counts.sum()):,} assistant tokens")
    if args.head:
        ids = ranked_ids(counts, args.size)
        if args.keep:
            kept = load_head(args.head).draft_ids
            if kept is None:
                raise ValueError(f"{args.head}: --keep needs a head with a stored draft vocabulary")
            ids = top_up(kept, ids, args.size)
            print(f"kept the head's {kept.numel():,} ids; they cover {float(counts[kept].sum() / counts.sum()):.4f}")
        write_draft_vocab(Path(args.head), ids)
        print(f"{args.head}: draft vocabulary of {ids.numel():,} ids written, covering "
              f"{float(counts[ids].sum() / counts.sum()):.4f} of the stores' assistant tokens")


if __name__ == "__main__":
    main()
