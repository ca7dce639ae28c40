"""The draft vocabulary: the target tokens the draft may propose, most frequent first.

The target verifies every draft, so restricting the draft to a subset of the vocabulary
never changes the output; it only removes the full-vocabulary `lm_head` work from drafting
(on a CPU the draft's largest cost). Counting happens over the tokens the draft has to
predict in training: assistant tokens (loss mask) of the feature store.

    python -m train.vocab STORE_DIR [STORE_DIR ...] [--head HEAD_DIR] [--size N] [--keep]

prints the coverage of the top-N tokens and, with --head, writes the vocabulary into that
head's checkpoint (`d2t` / `t2d`, see eagle.checkpoint); --keep tops the head's own
vocabulary up instead of replacing it.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path

import torch

from data_prep.store import FeatureStore
from eagle.checkpoint import load_head, top_up, write_draft_vocab


def token_counts(store: FeatureStore, indices: Iterable[int] | None = None, vocab_size: int | None = None) -> torch.Tensor:
    """How often each token id occurs under the loss mask of the given records. [V] int64"""
    vocab_size = vocab_size or int(store.manifest["target"]["vocab_size"])
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for i in range(len(store)) if indices is None else indices:
        input_ids, loss_mask = store.tokens(i)  # the features are never read
        counts += torch.bincount(input_ids[loss_mask], minlength=vocab_size)
    return counts


def draft_ids(counts: torch.Tensor, size: int | None = None, seen_only: bool = True) -> torch.Tensor:
    """Token ids by descending count (ties by id), at most `size`. [N] long

    seen_only: drop tokens never counted; otherwise exactly `size` ids (an EAGLE-3 lm_head
    has a fixed number of rows), unseen ones last by id."""
    order = torch.sort(-counts, stable=True).indices
    if seen_only:
        order = order[: int((counts > 0).sum())]
    return order[:size] if size else order


def coverage(counts: torch.Tensor, sizes: Iterable[int]) -> dict[int, float]:
    """Fraction of counted tokens inside the top-N ids, for each N."""
    ranked = torch.sort(counts, descending=True).values.cumsum(0).double()
    total = float(ranked[-1]) or 1.0
    return {n: float(ranked[min(n, ranked.numel()) - 1]) / total for n in sizes}


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
        ids = draft_ids(counts, args.size)
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
