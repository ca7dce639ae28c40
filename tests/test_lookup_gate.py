"""The prompt-lookup chain of a tuned model is merged only while it pays (eagle/decoding/lookup_gate.py)."""

from __future__ import annotations

from dataclasses import replace

import torch

from eagle.decoding.lookup_gate import FIRST, LookupGate, _depth_walked
from eagle.model import EaModel
from eagle.tuning.tuner import TreeBudget
from tests.tiny import FIXED, hf_greedy, near_bigram_pair, prompt

ROOT_ONLY = (torch.tensor([5]), torch.tensor([-1]))


def test_the_head_tree_alone_is_walked_along_the_reply():
    tokens, parents = [9, 1, 2, 3, 4], [-1, 0, 0, 1, 3]  # root 9; 1 -> 3 -> 4 and 2
    assert _depth_walked(tokens, parents, [1, 3, 4, 7]) == 3
    assert _depth_walked(tokens, parents, [2, 3]) == 1
    assert _depth_walked(tokens, parents, [8]) == 0


def step(gate: LookupGate, ids: list[int], chain: list[int], new: list[int], tree=ROOT_ONLY) -> tuple[list[int], bool]:
    merged = gate.use(len(ids), torch.tensor(chain, dtype=torch.long), *tree)
    ids = ids + new
    gate.record(torch.tensor(ids), torch.tensor(new))
    return ids, merged


def test_a_chain_that_never_matches_is_turned_off_after_the_first_steps():
    gate, ids, used = LookupGate(extra_cost=0.1), [1, 2, 3], []
    for k in range(12):
        ids, merged = step(gate, ids, [50, 51, 52], [10 + k])  # the reply never continues as the chain says
        used.append(merged)
    assert used[:FIRST] == [True] * FIRST and not any(used[FIRST + 1:])
    assert gate.steps_with_chain == sum(used)


def test_a_chain_that_copies_stays_on_and_waits_for_the_tokens_that_judge_it():
    gate, ids = LookupGate(extra_cost=0.3), [7, 8, 9]
    ids, _ = step(gate, ids, [1, 2, 3, 4], [1, 2])  # right so far: judged only once 4 tokens follow
    assert len(gate.pending) == 1 and not gate.seen
    ids, _ = step(gate, ids, [3, 4, 5, 6], [3, 4])
    assert gate.seen[0] == (1, 4) and len(gate.pending) == 1  # a = 1: the root-only tree held none of them
    for k in range(10):
        ids, merged = step(gate, ids, [k, k + 1, k + 2], [k, k + 1, k + 2, 99])
    assert merged and gate.on


def test_a_tuned_models_gate_keeps_greedy_output_and_turns_a_useless_chain_off():
    """With the chain costing a lot (extra 5x a step) and costing nothing, decoding equals HF greedy; the
    costly chain is merged on few steps, the free one is not gated."""
    target, head = near_bigram_pair(6)
    settings = replace(FIXED, total_token=4, depth=2, top_k=4, lookup=4)
    ids = prompt(3, 12)
    want = hf_greedy(target, ids, 40)
    merged = {}
    for extra in (5.0, 0.0):
        grid = [{"total_token": 4, "depth": 2, "lookup": 0, "tau": 1.5, "ms_per_step": 10.0, "tokens_per_s": 150.0},
                {"total_token": 4, "depth": 2, "lookup": 4, "tau": 1.6, "ms_per_step": 10.0 * (1 + extra),
                 "tokens_per_s": 1.0}]
        model = EaModel(target, head, settings=settings)
        model.tuning = TreeBudget(4, 2, 150.0, grid, lookup=4)
        assert model.tuning.chain_cost() == extra
        assert (model._lookup_gate() is None) == (extra == 0.0)  # a free chain is merged at every step
        assert torch.equal(model.eagenerate(ids, max_new_tokens=40), want)
        merged[extra] = model.last_stats.chain_steps / model.last_stats.steps
    assert merged[5.0] < 0.2 and merged[0.0] == 0  # ungated steps are not counted


def test_a_tree_picked_without_a_chain_gets_the_chain_that_suits_it():
    grid = [{"total_token": 1, "depth": 1, "lookup": 0, "tau": 1.0, "ms_per_step": 20.0, "tokens_per_s": 50.0},
            {"total_token": 8, "depth": 2, "lookup": 0, "tau": 2.0, "ms_per_step": 25.0, "tokens_per_s": 80.0},
            {"total_token": 8, "depth": 2, "lookup": 8, "tau": 2.1, "ms_per_step": 30.0, "tokens_per_s": 70.0},
            {"total_token": 4, "depth": 2, "lookup": 4, "tau": 1.9, "ms_per_step": 27.0, "tokens_per_s": 70.4}]
    budget = TreeBudget(0, 0, 0.0, grid)
    assert (budget.picked(10).total_token, budget.picked(10).lookup) == (8, 8)
    assert budget.picked(10).chain_cost() == 30.0 / 25.0 - 1
    assert budget.picked(0).lookup == 0 and budget.picked(0).chain_cost() is None
    assert budget.picked(4).lookup == 0  # no chain of at most 4 tokens was timed for the 8-node tree
    grid.append({"total_token": 8, "depth": 2, "lookup": 6, "tau": 2.1, "ms_per_step": 30.0, "tokens_per_s": 70.0})
    assert budget.picked(10).lookup == 8  # of chains that score alike, the longest
    grid[1:3] = [{**grid[2], "tokens_per_s": 90.0}, {**grid[2], "lookup": 4, "tokens_per_s": 90.0}]
    assert budget.picked(10).lookup == 8 and budget.picked(5).lookup == 4
