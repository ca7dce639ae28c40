"""Prompt lookup as a tree branch: chain search, merging into a tree, lossless decoding."""

from dataclasses import replace

import pytest
import torch

from eagle.decoding.prompt_lookup import lookup_chain, matched_length, merge_chain
from eagle.model import EaModel
from eagle.decoding.settings import TreeSettings
from eagle.decoding.tree import build_tree
from tests.tiny import TREES, hf_greedy, near_bigram_pair, random_head, tiny_llama


def test_lookup_chain_prefers_longer_and_more_recent_matches():
    ids = torch.tensor([5, 6, 7, 1, 2, 9, 9, 6, 7, 3, 4, 8, 6, 7])
    # tail (6, 7): two earlier matches; the most recent is at 7 -> the tokens after it
    assert lookup_chain(ids, 3, max_ngram=2).tolist() == [3, 4, 8]
    # with trigrams, (8, 6, 7) never occurred before: falls back to the bigram
    assert lookup_chain(ids, 2, max_ngram=3).tolist() == [3, 4]
    assert lookup_chain(torch.tensor([1, 2, 3]), 4).tolist() == []  # no earlier occurrence of anything
    assert lookup_chain(torch.tensor([4, 1, 2, 4]), 5, max_ngram=1).tolist() == [1, 2, 4]  # runs into the tail


def _brute_force_chain(ids: list[int], length: int, max_ngram: int) -> list[int]:
    """lookup_chain's contract, spelled out: the longest n <= max_ngram whose last n tokens occur earlier, at their
    latest earlier start, and the tokens after that occurrence."""
    total = len(ids)
    for n in range(min(max_ngram, total - 1), 0, -1):
        starts = [i for i in range(total - n) if ids[i:i + n] == ids[total - n:]]
        if starts:
            return ids[starts[-1] + n: starts[-1] + n + length]
    return []


@pytest.mark.parametrize("vocab", [2, 3, 7])
def test_lookup_chain_matches_its_contract_on_random_contexts(vocab):
    g = torch.Generator().manual_seed(vocab)
    for size in range(1, 40):
        ids = torch.randint(0, vocab, (size,), generator=g)
        for length, max_ngram in ((1, 3), (4, 3), (3, 1), (2, 5)):
            assert lookup_chain(ids, length, max_ngram).tolist() == _brute_force_chain(ids.tolist(), length, max_ngram)


def test_matched_length_counts_the_leading_tokens_a_chain_gets_right():
    def matched(chain, truth):  # the text after the context, cut to the chain as the callers cut it
        return matched_length(torch.tensor(chain, dtype=torch.long), torch.tensor(truth[:len(chain)], dtype=torch.long))

    assert matched([4, 5, 6], [4, 5, 7, 8]) == 2
    assert matched([], [1]) == 0
    assert matched([1, 2], [1]) == 1


def test_merge_chain_follows_existing_nodes_then_branches():
    tokens, parents = torch.tensor([0, 10, 11, 20]), torch.tensor([-1, 0, 0, 1])  # root -> 10 -> 20; root -> 11
    t, p = merge_chain(tokens, parents, torch.tensor([10, 20, 30, 31]))
    assert t.tolist() == [0, 10, 11, 20, 30, 31] and p.tolist() == [-1, 0, 0, 1, 3, 4]
    t, p = merge_chain(tokens, parents, torch.tensor([12]))
    assert t.tolist() == [0, 10, 11, 20, 12] and p.tolist() == [-1, 0, 0, 1, 0]
    build_tree(t, p)  # still a valid tree (parents before children)


@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("seed", range(4))
def test_greedy_equality_with_lookup(seed, tree):
    target = tiny_llama(seed)
    model = EaModel(target, random_head(target, seed), settings=replace(TREES[tree], lookup=6))
    period = torch.randint(3, 128, (5,), generator=torch.Generator().manual_seed(seed))
    ids = period.repeat(3)[None]  # a repetitive prompt: lookup finds matches
    ref = hf_greedy(target, ids, 32)
    assert torch.equal(model.eagenerate(ids, max_new_tokens=32), ref)


def test_lookup_lifts_tau_on_repetitive_output():
    target, head = near_bigram_pair(3)  # greedy output of a bigram-like target falls into a cycle
    ids = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(0))
    plain = EaModel(target, head, settings=TreeSettings(total_token=4, depth=2, top_k=2, lookup=0))
    looked = EaModel(target, head, settings=TreeSettings(total_token=4, depth=2, top_k=2, lookup=8))
    ref = hf_greedy(target, ids, 60)
    assert torch.equal(plain.eagenerate(ids, max_new_tokens=60), ref)
    assert torch.equal(looked.eagenerate(ids, max_new_tokens=60), ref)
    assert looked.last_stats.tau > plain.last_stats.tau + 0.5
