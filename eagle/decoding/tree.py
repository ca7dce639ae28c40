"""Draft trees as plain tensors: no model in this file.

A tree has N nodes, node 0 the *root*: the last token the target has already decided, not yet
in its KV cache. Every other node is a drafted token. Nodes are ordered parents before
children, so `parents[i] < i` for every non-root node.

Buffers derived from (tokens, parents):
- `depths [N]`      root 0, its children 1, ...; position id of node i = past_len + depths[i]
- `ancestors [N, N]` bool, ancestors[i, j] = node j is node i or one of its ancestors
                     (the tree attention pattern)
- `retrieve [L, D+1]` one row per leaf: node indices of the root-to-leaf path, padded with -1

Two ways to grow a tree (the drafting loop in `eagle.model` calls the head):
- static (EAGLE-1): a fixed list of *choices*, each a path of top-k ranks, e.g. [0], [0, 0], [1];
- dynamic (EAGLE-2): expand the `top_k` best nodes by cumulative draft log-probability for
  `depth` steps, then keep the `total_token - 1` best of all candidates (`select_nodes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

Choices = list[list[int]]

# EAGLE-1-style static tree, sized for a CPU (26 nodes with the root, depth 5). The verify
# forward over the tree is the expensive part on a CPU, so it stays small and leans on rank 0.
DEFAULT_CHOICES: Choices = [
    [0], [1], [2], [3],
    [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [3, 0],
    [0, 0, 0], [0, 0, 1], [0, 1, 0], [1, 0, 0], [0, 2, 0], [2, 0, 0],
    [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0],
    [0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 1, 0],
]


@dataclass
class Tree:
    """A draft tree ready for verification (see module docstring for the buffers). Trees of one shape share
    their parents, depths, ancestors and retrieve tensors (`tree_shape`): read them, never write them."""

    tokens: torch.Tensor  # [N] long
    parents: torch.Tensor  # [N] long, -1 for the root
    depths: torch.Tensor  # [N] long
    ancestors: torch.Tensor  # [N, N] bool
    retrieve: torch.Tensor  # [L, D+1] long, -1 padded

    @property
    def size(self) -> int:
        return int(self.tokens.numel())

    def children(self) -> list[list[int]]:
        """Children of each node, in node order (siblings in draft-rank order)."""
        kids: list[list[int]] = [[] for _ in range(self.size)]
        for i, p in enumerate(self.parents.tolist()):
            if p >= 0:
                kids[p].append(i)
        return kids


def chain_choices(k: int) -> Choices:
    """A plain chain of k drafted tokens as tree choices: [[0], [0, 0], ..., [0] * k]."""
    return [[0] * d for d in range(1, k + 1)]


def build_tree(tokens: torch.Tensor, parents: torch.Tensor) -> Tree:
    """Derive depths, ancestor mask and retrieve indices from tokens [N] and parents [N].

    The buffers depend on the parents alone, and a decoder's trees take few shapes (its tree with a lookup chain
    of 0..k tokens merged in), so they are made once per shape (`tree_shape`) and shared, read-only, by every tree
    of that shape."""
    shape = tree_shape(tuple(parents.tolist()))
    return Tree(tokens.to(torch.long), *shape)


@lru_cache(maxsize=1024)
def tree_shape(up: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(parents [N], depths [N], ancestors [N, N], retrieve [L, D+1]) of the tree whose node i has parent up[i].

    The walk runs over Python lists: a tree of a few to a few dozen nodes, where a tensor op per node (~5-15 µs
    each on a CPU) costs more than the lists and four tensors made at the end."""
    n = len(up)
    if n == 0 or up[0] != -1:
        raise ValueError("node 0 must be the root (parent -1)")
    if any(not 0 <= up[i] < i for i in range(1, n)):
        raise ValueError("every non-root node needs a parent that comes before it")
    paths = [[0]]  # root-to-node node indices of each node, ascending (parents come first)
    for i in range(1, n):
        paths.append(paths[up[i]] + [i])
    ancestors = torch.zeros(n, n, dtype=torch.bool)
    ancestors[[i for i, path in enumerate(paths) for _ in path], [j for path in paths for j in path]] = True
    depths = torch.tensor([len(path) - 1 for path in paths])
    return torch.tensor(up, dtype=torch.long), depths, ancestors, retrieve_indices(paths, set(up))


def retrieve_indices(paths: list[list[int]], inner: set[int]) -> torch.Tensor:
    """One row per leaf (a node not in `inner`, the parents), in node order: the node indices of its
    root-to-leaf path `paths[leaf]`, padded with -1. [L, D+1]"""
    leaves = [path for i, path in enumerate(paths) if i not in inner]
    width = max(len(path) for path in leaves)
    return torch.tensor([path + [-1] * (width - len(path)) for path in leaves], dtype=torch.long)


def tree_attention_mask(ancestors: torch.Tensor, past_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [1, 1, N, past_len + N]: the committed prefix plus each node's ancestors."""
    n = ancestors.shape[0]
    allowed = torch.cat([torch.ones(n, past_len, dtype=torch.bool), ancestors.cpu()], dim=1)
    return additive_mask(allowed, dtype)


def sliding_tree_mask(ancestors: torch.Tensor, depths: torch.Tensor, past_len: int, kept: int, window: int,
                      dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [1, 1, N, kept + N] of a sliding-window layer that holds the last `kept`
    committed rows: node i (position past_len + depths[i]) sees a key at position p only when it
    is within the window, past_len + depths[i] - p < window, as a plain forward would."""
    q = past_len + depths.cpu()  # [N] query positions
    cached = q[:, None] - torch.arange(past_len - kept, past_len)[None, :] < window  # [N, kept]
    tree = ancestors.cpu() & (depths.cpu()[:, None] - depths.cpu()[None, :] < window)  # [N, N]
    return additive_mask(torch.cat([cached, tree], dim=1), dtype)


def causal_mask(q_len: int, past_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive causal mask [1, 1, q_len, past_len + q_len] for q_len new rows after a prefix."""
    return tree_attention_mask(torch.ones(q_len, q_len, dtype=torch.bool).tril(), past_len, dtype)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool [Q, K] -> additive [1, 1, Q, K]: 0 where allowed, dtype-min where blocked."""
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


# ---- static trees (EAGLE-1) -------------------------------------------------------------


@dataclass
class StaticTree:
    """The shape of a static tree: node 0 the root, then the choices sorted by (depth, path)."""

    paths: list[tuple[int, ...]]  # [N], () for the root
    parents: torch.Tensor  # [N] long
    ranks: torch.Tensor  # [N] long, top-k rank of each node among its parent's draft tokens

    @property
    def depth(self) -> int:
        return max(len(p) for p in self.paths)

    def nodes_at(self, depth: int) -> list[int]:
        return [i for i, p in enumerate(self.paths) if len(p) == depth]


def static_tree(choices: Choices) -> StaticTree:
    """Validate and order a choice list; every prefix of a choice must be a choice too."""
    paths = sorted({tuple(c) for c in choices}, key=lambda p: (len(p), p))
    if not paths or any(len(p) == 0 or min(p) < 0 for p in paths):
        raise ValueError("choices must be non-empty paths of non-negative top-k ranks")
    paths = [()] + paths
    index = {p: i for i, p in enumerate(paths)}
    missing = [p for p in paths[1:] if p[:-1] not in index]
    if missing:
        raise ValueError(f"tree choices lack the parents of {missing[:3]}")
    parents = torch.tensor([-1] + [index[p[:-1]] for p in paths[1:]], dtype=torch.long)
    ranks = torch.tensor([0] + [p[-1] for p in paths[1:]], dtype=torch.long)
    return StaticTree(paths, parents, ranks)


# ---- dynamic trees (EAGLE-2) ------------------------------------------------------------


def expand_topk(parent_scores: list[float], logp: torch.Tensor, k: int) -> tuple[torch.Tensor, list[float], list[int]]:
    """Top-k children of every frontier node: parent_scores [F] cumulative log-probs of the frontier
    nodes, logp [F, V] draft log-probs of each one's next token.

    Returns the children's draft indices [F*k] (a tensor), their cumulative scores and their frontier
    rows (lists of F*k), children of frontier row f contiguous and in rank order. The scores add up as
    Python floats: a step's few dozen numbers, where a tensor op each costs more.
    """
    top_logp, top_tokens = logp.topk(k, dim=-1)  # [F, k]
    scores = [p + s for p, row in zip(parent_scores, top_logp.tolist(), strict=True) for s in row]
    return top_tokens.flatten(), scores, [f for f in range(len(parent_scores)) for _ in range(k)]


def select_nodes(scores: list[float] | torch.Tensor, parents: list[int] | torch.Tensor, keep: int) -> list[int]:
    """Keep the `keep` best candidates by score, closed under parents, in candidate order.

    `scores [M]` are cumulative log-probs and `parents [M]` candidate indices (-1 = the root),
    parents listed before children. A child never scores above its parent, and the stable
    sort ranks an equal-scoring parent first, so the top `keep` are closed under parents;
    this is checked. Returns the kept candidate indices [min(keep, M)], ascending. Over Python
    lists, as `build_tree`: a step's few dozen candidates."""
    s, up = _listed(scores), _listed(parents)
    order = sorted(range(len(s)), key=lambda i: -s[i])  # stable: an equal score keeps candidate order
    kept = sorted(order[: max(0, min(keep, len(s)))])
    chosen = set(kept)
    if any(up[i] >= 0 and up[i] not in chosen for i in kept):
        raise AssertionError("dynamic tree selection dropped a parent of a kept node")
    return kept


def reindex_parents(kept: list[int], parents: list[int] | torch.Tensor) -> torch.Tensor:
    """Parents of kept candidates as tree node indices (root = node 0, kept[i] = node i + 1; -1 where a
    parent was not kept)."""
    up = _listed(parents)
    node = {c: i + 1 for i, c in enumerate(kept)}
    return torch.tensor([-1] + [node.get(up[c], -1) if up[c] >= 0 else 0 for c in kept], dtype=torch.long)


def _listed(x: list | torch.Tensor) -> list:
    return x.tolist() if isinstance(x, torch.Tensor) else x
