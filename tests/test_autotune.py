"""The tree tuner's cost model and choice (eagle.tuning.tuner), without a model."""

import itertools
import time

import pytest

from eagle.tuning.tuner import PLAIN, TreeBudget, choose, fastest_ms, forward_costs, monotone_costs, walk_tau


def test_monotone_costs_keep_rising_costs_and_a_kink():
    costs = {2: 12.6, 4: 15.0, 8: 27.3, 16: 34.8, 32: 50.0}  # autotuned small forwards, then oneDNN's: not a line
    assert monotone_costs(costs) == pytest.approx(costs)


def test_monotone_costs_share_out_a_slow_measurement():
    line = {n: 40.0 + 0.75 * n for n in (8, 12, 16, 24, 32, 48, 64)}
    noisy = {**line, 8: line[8] + 30.0}  # one size timed while something else ran
    fit = monotone_costs(noisy)
    assert all(fit[a] <= fit[b] for a, b in itertools.pairwise(sorted(fit)))  # bigger trees never cost less
    assert abs(fit[8] - line[8]) < 15.0 < noisy[8] - line[8]  # the burst is mostly shared out
    assert fit[64] == pytest.approx(line[64])  # costs after the pooled ones stay as measured
    falling = monotone_costs({3: 20.0, 5: 12.0, 7: 10.0})
    assert falling == pytest.approx({3: 14.0, 5: 14.0, 7: 14.0})  # a falling run pools to its mean
    assert monotone_costs({4: 7.0}) == {4: 7.0}


def test_a_plain_step_costs_no_more_than_a_two_row_verify():
    """The AVX2 bench's EAGLE-3 tune: plain timed at 31.8 ms beside a 2-row verify at 29.2 (25.3 a minute
    before): pooled, so the 2-node tree no longer looks 7 % faster than plain steps."""
    plain, verify = forward_costs({PLAIN: 31.8, 2: 29.2, 4: 35.8, 8: 47.2})
    assert plain == pytest.approx(30.5) and verify[2] == pytest.approx(30.5)
    assert verify[4] == 35.8 and verify[8] == 47.2
    plain, verify = forward_costs({PLAIN: 25.3, 2: 30.7, 4: 39.8})
    assert plain == 25.3 and verify == {2: 30.7, 4: 39.8}  # a cheaper plain step stays as measured


def test_fastest_ms_interleaves_rounds_and_keeps_each_keys_fastest():
    calls = []
    slow = iter([0.0, 0.0, 0.02, 0.0, 0.0, 0.0])  # one call of the second round is slowed down

    def timed(key):  # the fn of `key`: records the call, sleeps when told to
        def fn():
            calls.append(key)
            delay = next(slow)
            if delay:
                time.sleep(delay)
        return fn

    ms = fastest_ms({1: timed(1), 2: timed(2)}, rounds=2)
    assert calls == [1, 2, 1, 2, 1, 2]  # a warm-up round, then rounds visiting every key in turn
    assert ms[1] < 5.0 and ms[2] < 5.0  # the slowed call (key 1, round 1) is not the one kept


def test_choose_takes_the_cheapest_of_the_nearly_fastest():
    grid = [
        {"total_token": 8, "depth": 3, "ms_per_step": 70.0, "tokens_per_s": 29.5},
        {"total_token": 32, "depth": 3, "ms_per_step": 85.0, "tokens_per_s": 30.0},
        {"total_token": 64, "depth": 6, "ms_per_step": 120.0, "tokens_per_s": 24.0},
    ]
    assert choose(grid)["total_token"] == 8  # within 3 % of the best: timings cannot tell them apart
    assert choose(grid, tolerance=0.0)["total_token"] == 32


def test_a_tree_picked_without_a_chain_gets_a_chain_only_where_it_is_expected_to_pay():
    grid = [{"total_token": 1, "depth": 1, "lookup": 0, "tau": 1.0, "ms_per_step": 20.0, "tokens_per_s": 50.0},
            {"total_token": 8, "depth": 2, "lookup": 0, "tau": 2.0, "ms_per_step": 25.0, "tokens_per_s": 80.0},
            {"total_token": 8, "depth": 2, "lookup": 8, "tau": 2.1, "ms_per_step": 30.0, "tokens_per_s": 70.0},
            {"total_token": 4, "depth": 2, "lookup": 4, "tau": 1.9, "ms_per_step": 27.0, "tokens_per_s": 70.4}]
    budget = TreeBudget(0, 0, 0.0, grid)
    assert (budget.picked(10).total_token, budget.picked(10).lookup) == (8, 0)  # the chain would slow the tree
    grid[2]["tokens_per_s"] = 79.0  # within TOLERANCE, still slower than the tree alone
    assert budget.picked(10).lookup == 0
    grid[2]["tokens_per_s"] = 82.0  # chosen as the cheaper of near-equals, the tree gets the chain that pays
    assert (budget.picked(10).total_token, budget.picked(10).lookup) == (8, 8)
    assert budget.picked(10).tokens_per_second == 82.0
    assert budget.picked(0).lookup == 0
    assert budget.picked(4).lookup == 0  # no chain of at most 4 tokens was timed for the 8-node tree
    grid.append({"total_token": 8, "depth": 2, "lookup": 6, "tau": 2.1, "ms_per_step": 30.0, "tokens_per_s": 82.0})
    assert budget.picked(10).lookup == 8  # of chains that score alike, the longest
    grid[1:3] = [{**grid[2], "tokens_per_s": 90.0}, {**grid[2], "lookup": 4, "tokens_per_s": 90.0}]
    assert budget.picked(10).lookup == 8 and budget.picked(5).lookup == 4


def test_a_walk_moves_past_what_each_step_accepts_and_counts_the_steps():
    assert walk_tau([3, 1, 1, 2, 1, 1], [0] * 6, [6], 0) == 6 / 3  # steps start at positions 0, 3, 5
    # a chain of 3 matching tokens at position 1 carries the step to position 5: positions 2 and 3, each with
    # a long match of its own, never start a step (a mean over all positions would count them)
    assert walk_tau([1] * 6, [0, 3, 2, 1, 0, 0], [6], 6) == 6 / 3
    assert walk_tau([1] * 6, [0, 3, 2, 1, 0, 0], [6], 2) == 6 / 4  # the chain clipped to 2: positions 0, 1, 4, 5
    # two texts: a step never crosses from one into the next (3 steps over the first, 2 over the second)
    assert walk_tau([2, 1, 1, 1, 1, 1], [0] * 6, [4, 6], 0) == 6 / 5


def test_choose_leaves_out_rows_not_timed_as_decoding():
    grid = [{"total_token": 1, "depth": 1, "lookup": 0, "ms_per_step": 10.0, "tokens_per_s": 100.0, "timed": True},
            {"total_token": 8, "depth": 2, "lookup": 0, "ms_per_step": 20.0, "tokens_per_s": 130.0, "timed": True},
            {"total_token": 4, "depth": 2, "lookup": 4, "ms_per_step": 17.0, "tokens_per_s": 140.0, "timed": False}]
    assert choose(grid)["total_token"] == 8  # the parts' sum alone does not decide
    grid[2]["timed"] = True
    assert choose(grid)["total_token"] == 4
