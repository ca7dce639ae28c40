"""Pure tree functions: static buffers, dynamic selection, masks, retrieve indices."""

from __future__ import annotations

import pytest
import torch

from eagle.decoding.tree import (
    DEFAULT_CHOICES,
    build_tree,
    causal_mask,
    expand_topk,
    reindex_parents,
    select_nodes,
    static_tree,
    tree_attention_mask,
)


def path_of(tree, node: int) -> list[int]:
    path = [node]
    while tree.parents[path[-1]] >= 0:
        path.append(int(tree.parents[path[-1]]))
    return path[::-1]


def check_tree(tree) -> None:
    """Invariants every tree must satisfy."""
    n = tree.size
    assert tree.parents[0] == -1 and all(0 <= int(tree.parents[i]) < i for i in range(1, n))
    for i in range(n):
        path = path_of(tree, i)
        assert tree.depths[i] == len(path) - 1
        assert tree.ancestors[i].nonzero().flatten().tolist() == path
    leaves = [i for i in range(n) if i not in set(tree.parents.tolist())]
    rows = [[j for j in row if j >= 0] for row in tree.retrieve.tolist()]
    assert sorted(r[-1] for r in rows) == leaves
    for r in rows:
        assert r == path_of(tree, r[-1])
    assert tree.retrieve.shape[1] == int(tree.depths.max()) + 1


def test_static_tree_orders_parents_first():
    shape = static_tree([[1], [0, 1], [0], [0, 0], [0, 0, 0]])
    assert shape.paths == [(), (0,), (1,), (0, 0), (0, 1), (0, 0, 0)]
    assert shape.parents.tolist() == [-1, 0, 0, 1, 1, 3]
    assert shape.ranks.tolist() == [0, 0, 1, 0, 1, 0]
    assert shape.depth == 3 and shape.nodes_at(2) == [3, 4]
    check_tree(build_tree(torch.arange(6), shape.parents))


def test_default_static_tree_is_valid_and_small():
    shape = static_tree(DEFAULT_CHOICES)
    assert 16 <= len(shape.paths) <= 40
    check_tree(build_tree(torch.arange(len(shape.paths)), shape.parents))


@pytest.mark.parametrize("bad", [[[0, 1]], [[]], [[-1]], []])
def test_static_tree_rejects_bad_choices(bad):
    with pytest.raises(ValueError):
        static_tree(bad)


def test_build_tree_buffers_by_hand():
    #      0
    #    1   2
    #   3 4   5
    #   6
    tree = build_tree(torch.tensor([10, 11, 12, 13, 14, 15, 16]), torch.tensor([-1, 0, 0, 1, 1, 2, 3]))
    assert tree.depths.tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert tree.retrieve.tolist() == [[0, 1, 4, -1], [0, 2, 5, -1], [0, 1, 3, 6]]
    assert tree.children() == [[1, 2], [3, 4], [5], [6], [], [], []]
    check_tree(tree)
    mask = tree_attention_mask(tree.ancestors, past_len=3, dtype=torch.float32)
    assert mask.shape == (1, 1, 7, 10)
    assert (mask[0, 0, :, :3] == 0).all()
    blocked = torch.finfo(torch.float32).min
    assert mask[0, 0, 6, 3:].tolist() == [0, 0, blocked, 0, blocked, blocked, 0]


def test_trees_of_one_shape_share_its_buffers_and_keep_their_tokens():
    parents = [-1, 0, 0, 1]
    a = build_tree(torch.tensor([5, 6, 7, 8]), torch.tensor(parents))
    b = build_tree(torch.tensor([9, 1, 2, 3]), torch.tensor(parents))
    assert a.tokens.tolist() == [5, 6, 7, 8] and b.tokens.tolist() == [9, 1, 2, 3]
    assert a.ancestors is b.ancestors and a.retrieve is b.retrieve and a.depths is b.depths
    assert a.parents.tolist() == parents and a.depths.tolist() == [0, 1, 1, 2]


def test_build_tree_rejects_child_before_parent():
    with pytest.raises(ValueError):
        build_tree(torch.arange(3), torch.tensor([-1, 2, 0]))


def test_causal_mask():
    mask = causal_mask(3, 2, torch.float32)[0, 0]
    assert ((mask == 0) == torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)).all()


def test_expand_topk():
    logp = torch.tensor([[-0.1, -3.0, -2.0], [-1.0, -0.5, -4.0]]).log_softmax(-1)
    tokens, scores, rows = expand_topk([-1.0, -2.0], logp, 2)
    assert tokens.tolist() == [0, 2, 1, 0]
    assert rows == [0, 0, 1, 1]
    assert torch.allclose(torch.tensor(scores), torch.tensor([-1.0, -1.0, -2.0, -2.0]) + logp[[0, 0, 1, 1], [0, 2, 1, 0]])


def grow_random_pool(seed: int, vocab: int, k: int, depth: int, peaked: bool):
    """The dynamic expansion with random draft log-probs (peaked: many exact log p = 0)."""
    g = torch.Generator().manual_seed(seed)

    def random_logp(rows):
        logits = torch.randn(rows, vocab, generator=g) * (200.0 if peaked else 2.0)
        return logits.log_softmax(-1)

    _, scores, _ = expand_topk([0.0], random_logp(1), k)
    parents = [-1] * k
    frontier = list(range(k))
    for _ in range(1, depth):
        _, s, rows = expand_topk([scores[i] for i in frontier], random_logp(k), k)
        n = len(scores)
        scores += s
        parents += [frontier[r] for r in rows]
        frontier = [n + i for i in torch.tensor(s).topk(k).indices.tolist()]
    return torch.tensor(scores), torch.tensor(parents)


@pytest.mark.parametrize("seed", range(20))
def test_dynamic_selection_keeps_parents_and_best_scores(seed):
    peaked = seed % 2 == 1  # exact ties between a parent and a child of probability 1
    scores, parents = grow_random_pool(seed, vocab=12, k=3 + seed % 3, depth=4, peaked=peaked)
    keep = 5 + seed
    kept = torch.tensor(select_nodes(scores, parents, keep))
    assert kept.numel() == min(keep, scores.numel())
    assert (kept.diff() > 0).all()
    threshold = scores[kept].min()
    assert (scores[kept] >= threshold).all() and int((scores > threshold).sum()) <= kept.numel()
    tree_parents = reindex_parents(kept.tolist(), parents)
    tree = build_tree(torch.zeros(kept.numel() + 1, dtype=torch.long), tree_parents)  # raises if unordered
    check_tree(tree)
    for node, cand in enumerate(kept.tolist(), start=1):  # parent mapping round-trips
        p = int(parents[cand])
        assert int(tree_parents[node]) == (0 if p < 0 else kept.tolist().index(p) + 1)


def test_select_nodes_detects_a_broken_pool():
    scores = torch.tensor([-1.0, -0.5])  # child scoring above its parent cannot come from log-probs
    with pytest.raises(AssertionError):
        select_nodes(scores, torch.tensor([-1, 0]), 1)


def test_a_sliding_window_mask_sees_only_positions_inside_the_window():
    """Window 3, five committed tokens of which the layer keeps the last two (positions 3, 4),
    a chain root -> a -> b at positions 5, 6, 7: b sees only a, itself and the root."""
    from eagle.decoding.tree import sliding_tree_mask

    chain = build_tree(torch.tensor([9, 8, 7]), torch.tensor([-1, 0, 1]))
    allowed = sliding_tree_mask(chain.ancestors, chain.depths, past_len=5, kept=2, window=3, dtype=torch.float32) == 0
    assert allowed[0, 0].tolist() == [[True, True, True, False, False],
                                      [False, True, True, True, False],
                                      [False, False, True, True, True]]
