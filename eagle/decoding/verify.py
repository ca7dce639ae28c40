"""Accepting draft tokens: greedy matching and lossless rejection sampling over a tree.

Naming: **p is the target** distribution, **q the draft** distribution. Drafts here are
deterministic (top-k of the draft logits), so for the sibling being tried q is one-hot and
the speculative-sampling test `u < min(1, p(x) / q(x))` becomes `u < p(x)`; on rejection
the residual `norm(max(0, p - q))` is p with x removed and renormalized.

`process_logits` / `sample` are the one definition of temperature, top-k and top-p used by
both plain sampling (`naivegenerate`) and verification, so both sample the same p.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from eagle.decoding.tree import Tree

NUMPY_WIDENED_ROWS = 16  # bf16 rows up to which greedy_ids widens them for NumPy ([16, 49152]: 0.45 ms against
# torch's 1.6; [256, 49152]: 47 against 25)


@dataclass
class SamplingParams:
    """temperature 0 = greedy; top_p 0 or 1 = no nucleus cut; top_k 0 = no top-k cut."""

    temperature: float = 0.0
    top_p: float = 0.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature={self.temperature}: use 0 for greedy decoding or a finite value > 0")
        if not 0.0 <= self.top_p <= 1.0:  # NaN fails too
            raise ValueError(f"top_p={self.top_p}: use a value in (0, 1], or 0 for no nucleus cut")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise ValueError(f"top_k={self.top_k}: use a whole number >= 0 (0 = no top-k cut)")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p on logits [..., V]; removed tokens get -inf (fp32)."""
    logits = logits.float() / params.temperature
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = logits.topk(params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if 0.0 < params.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # mass of strictly better tokens
        drop_sorted = mass_before >= params.top_p  # the top token always stays
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """p: the processed target distribution [..., V] (fp32)."""
    return process_logits(logits, params).softmax(dim=-1)


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the last dimension (the first of ties) [...] long. On a CPU through NumPy's argmax: torch
    2.13's CPU `max`/`argmax` over a row is a scalar loop on one thread ([1, 49152] fp32: 0.15-0.22 ms against
    NumPy's 0.01; [4, 49152], a 4-node verify: 0.38 against 0.03). bf16/fp16 rows are widened to fp32 first
    (exact), which pays up to NUMPY_WIDENED_ROWS rows; more, and other dtypes, keep torch's `max` (argmax over bf16
    is slower still)."""
    rows = logits.numel() // max(1, logits.shape[-1])
    widened = logits.dtype in (torch.bfloat16, torch.float16) and rows <= NUMPY_WIDENED_ROWS
    if logits.device.type != "cpu" or not (logits.dtype == torch.float32 or widened):
        return logits.max(dim=-1).indices
    return torch.from_numpy(np.asarray(logits.detach().float().numpy().argmax(axis=-1)))  # a 0-d array for a row


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """Next token(s) from logits [..., V] -> [...] long: argmax if greedy, else a draw from p."""
    if params.greedy:
        return greedy_ids(logits)
    probs = target_probs(logits, params)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def verify_greedy(tree: Tree, logits: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Longest root-to-node path whose drafts equal the target argmax.

    logits [N, V]: target logits at each tree node (under the tree mask). Returns the
    accepted node indices [n] (root first, n >= 1) and the bonus token: the target's
    argmax after the last accepted node. The first of equally long paths, in leaf order, wins.
    The walk runs over Python lists: a tree's few leaves cost less so than a dozen tensor ops."""
    best = greedy_ids(logits).reshape(-1).tolist()  # [N] the target's next token after each node
    tokens = tree.tokens.tolist()  # [N]
    path = [0]
    for leaf in tree.retrieve.tolist():  # [D+1] node indices, root first, -1 padded
        n = 1
        while n < len(leaf) and leaf[n] >= 0 and tokens[leaf[n]] == best[leaf[n - 1]]:
            n += 1
        if n > len(path):
            path = leaf[:n]
    return torch.tensor(path), best[path[-1]]


def verify_sampling(
    tree: Tree, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, int]:
    """Recursive rejection sampling over siblings; the output is distributed exactly as p.

    logits [N, V]: target logits at each tree node; p = `target_probs` of a node's logits,
    computed only for the nodes visited. Walks from the root: each child x of the current
    node, in order, is accepted with probability p(x); a rejected x gets p(x) = 0 and p is
    renormalized before the next sibling; when every child is rejected the bonus token is
    drawn from what is left of p. Returns accepted node indices [n] and the bonus.
    """
    children = tree.children()
    tokens = tree.tokens.tolist()
    node, path = 0, [0]
    while True:
        p = target_probs(logits[node], params).cpu()  # [V]
        accepted = None
        for child in children[node]:
            x = tokens[child]
            if torch.rand((), generator=generator) < p[x]:  # q(x) = 1 for this sibling
                accepted = child
                break
            p[x] = 0.0  # residual norm(max(0, p - q))
            total = p.sum()
            if total <= 0:  # only float round-off gets here; fall back to p
                p = target_probs(logits[node], params).cpu()
                break
            p /= total
        if accepted is None:
            return torch.tensor(path), int(torch.multinomial(p, 1, generator=generator))
        node = accepted
        path.append(node)
