"""Tree verification: masked tree logits equal causal forwards; greedy acceptance; logits processing."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from eagle.decoding.tree import DEFAULT_CHOICES, build_tree, static_tree, tree_attention_mask
from eagle.decoding.verify import NUMPY_WIDENED_ROWS, SamplingParams, greedy_ids, process_logits, sample, verify_greedy
from tests.tiny import tiny_llama


def random_tree(seed: int, n: int, vocab: int):
    g = torch.Generator().manual_seed(seed)
    parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)])
    return build_tree(torch.randint(0, vocab, (n,), generator=g), parents)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("rows", [1, 4, NUMPY_WIDENED_ROWS + 1])
def test_greedy_ids_are_torch_max_indices_ties_included(dtype, rows):
    """greedy_ids (NumPy's argmax on a CPU) picks what torch's `max` picks: the first of equal logits, any shape."""
    g = torch.Generator().manual_seed(rows)
    logits = (torch.randn(2, rows, 500, generator=g) * 2).round().to(dtype)  # many ties
    logits[0, 0, 3] = logits[0, 0, 9] = 50  # a tie at the top
    got = greedy_ids(logits)
    assert got.dtype == torch.long and torch.equal(got, logits.max(dim=-1).indices)
    assert int(got[0, 0]) == 3
    assert torch.equal(greedy_ids(logits[:, :, ::2]), logits[:, :, ::2].max(dim=-1).indices)  # strided rows
    assert torch.equal(greedy_ids(logits[0, 0]), torch.tensor(3))  # one row [V] -> a 0-d index
    with torch.inference_mode():
        assert torch.equal(greedy_ids(logits.clone()), got)


@pytest.mark.parametrize("seed", range(4))
def test_tree_logits_equal_causal_forward_over_each_path(seed):
    model = tiny_llama(seed)
    g = torch.Generator().manual_seed(100 + seed)
    prefix = torch.randint(0, 128, (1, 5 + seed), generator=g)
    if seed % 2:
        tree = build_tree(torch.randint(0, 128, (26,), generator=g), static_tree(DEFAULT_CHOICES).parents)
    else:
        tree = random_tree(seed, 20, 128)
    past = prefix.shape[1]
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(input_ids=prefix, past_key_values=cache, use_cache=True)
        mask = tree_attention_mask(tree.ancestors, past, torch.float32)
        out = model(input_ids=tree.tokens[None], position_ids=(past + tree.depths)[None], attention_mask=mask,
                    past_key_values=cache, use_cache=True, output_hidden_states=True)
        for node in range(tree.size):
            path = tree.ancestors[node].nonzero().flatten()
            ref = model(input_ids=torch.cat([prefix[0], tree.tokens[path]])[None], output_hidden_states=True)
            assert torch.allclose(out.logits[0, node], ref.logits[0, -1], atol=1e-5), node
            assert torch.allclose(out.hidden_states[-1][0, node], ref.hidden_states[-1][0, -1], atol=1e-5)
    # the feature convention: lm_head(hidden_states[-1]) are the logits
    assert torch.allclose(model.lm_head(out.hidden_states[-1]), out.logits, atol=1e-5)


def test_verify_greedy_longest_matching_path():
    #      0
    #    1   2
    #   3     4
    #         5
    tree = build_tree(torch.tensor([9, 1, 2, 3, 4, 5]), torch.tensor([-1, 0, 0, 1, 2, 4]))
    logits = torch.zeros(6, 10)
    argmax = {0: 2, 1: 3, 2: 4, 3: 7, 4: 6, 5: 8}  # target prefers 2 after the root, then 4, then 6
    for node, tok in argmax.items():
        logits[node, tok] = 1.0
    path, bonus = verify_greedy(tree, logits)
    assert path.tolist() == [0, 2, 4] and bonus == 6
    logits[0] = 0
    logits[0, 5] = 1.0  # no child of the root matches
    path, bonus = verify_greedy(tree, logits)
    assert path.tolist() == [0] and bonus == 5


def test_verify_greedy_accepts_a_whole_path_to_a_leaf():
    tree = build_tree(torch.tensor([0, 1, 2]), torch.tensor([-1, 0, 1]))
    logits = torch.zeros(3, 5)
    logits[0, 1] = logits[1, 2] = logits[2, 4] = 1.0
    path, bonus = verify_greedy(tree, logits)
    assert path.tolist() == [0, 1, 2] and bonus == 4


def test_verify_greedy_takes_the_longest_matching_path_of_random_trees():
    """Against every node's own check: a node is acceptable when each drafted token on its path equals the target's
    argmax after its parent; the accepted path ends at the deepest acceptable node (the first leaf's among equals)."""
    for seed in range(200):
        tree = random_tree(seed, 2 + seed % 14, vocab=3)
        logits = torch.randn(tree.size, 3, generator=torch.Generator().manual_seed(seed))
        best = logits.argmax(-1).tolist()
        parents, tokens = tree.parents.tolist(), tree.tokens.tolist()

        def acceptable(node: int) -> bool:
            return node == 0 or (tokens[node] == best[parents[node]] and acceptable(parents[node]))

        deepest = max(tree.depths[i] for i in range(tree.size) if acceptable(i))
        path, bonus = verify_greedy(tree, logits)
        assert len(path) == deepest + 1 and all(acceptable(i) for i in path.tolist())
        assert path.tolist() == [i for i in tree.retrieve[(tree.retrieve == path[-1]).any(1)][0].tolist() if i >= 0][
            : len(path)]
        assert bonus == best[path[-1]] and path.dtype == torch.long


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 0.0), (0.7, 5, 0.0), (1.3, 0, 0.8), (1.0, 7, 0.5)])
def test_process_logits_matches_hf_warpers(temperature, top_k, top_p):
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(3)) * 2
    ours = process_logits(logits, SamplingParams(temperature, top_p, top_k))
    ref = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        ref = TopKLogitsWarper(top_k)(None, ref)
    if top_p:
        ref = TopPLogitsWarper(top_p)(None, ref)
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    assert torch.allclose(ours.softmax(-1), ref.softmax(-1), atol=1e-6)


def test_sample_greedy_is_argmax():
    logits = torch.randn(3, 20)
    assert torch.equal(sample(logits, SamplingParams()), logits.argmax(-1))
