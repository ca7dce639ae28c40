"""Take a reply's loops out of the loss (`data.mask_repeats=N`).

A small target decoding greedily often falls into a loop: the same sentence again and again
until `max_new_tokens`. Regenerated with such a target, most reply tokens of a corpus can lie
in loops, and a draft head trained on them spends its capacity learning to copy, which prompt
lookup (eagle/decoding/prompt_lookup.py) already does for free at decoding time.

    mask = mask_repeats(input_ids, loss_mask, n)   # [S] 0/1, a subset of loss_mask

A reply token stays in the loss unless it completes an n-gram of reply tokens (n consecutive
tokens with loss_mask set) that already occurred earlier in the same record. The tokens that
start a repetition (its first n - 1) stay in, so the head still learns where loops begin;
the rest of the loop drops out. The tokens remain in `input_ids`: the context the head sees
is the target's own text.
"""

from __future__ import annotations


def mask_repeats(input_ids: list[int], loss_mask: list[int], n: int) -> list[int]:
    """`loss_mask` without the reply tokens that complete a repeated n-gram of reply tokens."""
    if n < 1:
        raise ValueError(f"data.mask_repeats={n}: expected an n-gram length of at least 1 (or null: off)")
    seen: set[tuple[int, ...]] = set()
    out = list(loss_mask)
    run = 0  # consecutive reply tokens ending at position t
    for t, inside in enumerate(loss_mask):
        run = run + 1 if inside else 0
        if run < n:
            continue
        gram = tuple(input_ids[t - n + 1:t + 1])
        if gram in seen:
            out[t] = 0
        else:
            seen.add(gram)
    return out

