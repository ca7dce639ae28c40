"""Prompt lookup as one more branch of the draft tree (training-free, verified like any draft).

Small chat models repeat themselves and copy from the prompt (code, extraction, lists,
loops). Prompt lookup decoding (PLD) drafts exactly that: find the last n tokens earlier in
the context and propose what followed them. Here the looked-up chain is merged into the
EAGLE tree instead of replacing it: where the chain agrees with the head's tree it follows
the existing nodes, where it departs it adds new ones. The target still verifies every node,
so the output is unchanged; a step gains when the copy is longer than the head's best path.
"""

from __future__ import annotations

import numpy as np
import torch


def lookup_chain(ids: torch.Tensor, length: int, max_ngram: int = 3) -> torch.Tensor:
    """Tokens that followed the most recent earlier occurrence of the context's last n tokens.

    ids [L]: the committed context (its last token is the tree's root). Tries n = max_ngram
    down to 1 and returns up to `length` tokens [k] (k = 0 when nothing matches). Over NumPy: a
    comparison and a few gathers each n, where torch's ops cost several times as much on a CPU.
    """
    ids = ids.flatten().cpu()
    seq = ids.numpy()
    total = seq.size
    for n in range(min(max_ngram, total - 1), 0, -1):
        tail = seq[total - n:]
        starts = np.flatnonzero(seq[: total - n] == tail[0])  # earlier n-grams' starts (not the tail itself)
        for j in range(1, n):
            starts = starts[seq[starts + j] == tail[j]]
        if starts.size:
            start = int(starts[-1]) + n  # the most recent match
            return ids[start: start + length]
    return ids[:0]


def matched_length(chain: torch.Tensor, truth: torch.Tensor) -> int:
    """How many leading tokens of chain [k] equal the tokens truth [t] that really followed (t may be < k)."""
    return int((chain[: truth.numel()] == truth).long().cumprod(0).sum())


def merge_chain(tokens: torch.Tensor, parents: torch.Tensor, chain: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Add a chain below the root (node 0) of a tree given as tokens [N] / parents [N].

    Follows existing nodes while the chain matches a child's token, then appends the rest as
    new nodes (parents before children). Returns the new tokens [N'] and parents [N'].
    """
    token_list, parent_list = tokens.tolist(), parents.tolist()
    children: dict[int, dict[int, int]] = {}
    for i, p in enumerate(parent_list):
        if p >= 0:
            children.setdefault(p, {}).setdefault(token_list[i], i)
    node = 0
    for t in chain.tolist():
        nxt = children.get(node, {}).get(t)
        if nxt is None:
            token_list.append(t)
            parent_list.append(node)
            nxt = len(token_list) - 1
            children.setdefault(node, {})[t] = nxt
        node = nxt
    return torch.tensor(token_list, dtype=torch.long), torch.tensor(parent_list, dtype=torch.long)
