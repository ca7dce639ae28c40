"""experiments.walk_calibration: the walk a decoder takes over a greedy text, and its per-position scores
replaying the tuner's calibration (`tuner.score_trees`) wherever the largest tree's walk lands."""

import torch

from eagle.decoding.settings import TreeSettings
from eagle.model import EaModel
from eagle.tuning.tuner import Calibration, calibration_prompts
from experiments.walk_calibration import DEPTHS, SIZES, per_position, sampled_tau, walk, walk_tau
from tests.tiny import near_bigram_pair


def test_a_walk_moves_past_what_each_step_accepts_and_counts_the_steps():
    assert walk([3, 1, 1, 2, 1, 1], [0] * 6, 0) == (6, 3)  # positions 0, 3, 5
    # a chain of 3 matching tokens at position 1 carries the step to position 5; uniform positions would
    # also score positions 2 and 3, which this walk never starts a step at
    assert walk([1] * 6, [0, 3, 2, 1, 0, 0], 6) == (6, 3)
    assert walk([1] * 6, [0, 3, 2, 1, 0, 0], 2) == (6, 4)  # the chain clipped to 2: positions 0, 1, 4, 5
    assert walk(None, [0, 3, 2, 1, 0, 0], 6) == (6, 3)  # prompt lookup alone
    texts = [({(2, 1): [2, 1, 1, 1]}, [0, 0, 0, 0]), ({(2, 1): [1, 1]}, [1, 0])]
    assert walk_tau(texts, 2, 1, 0) == 6 / 5  # 3 steps over the first text, 2 over the second


def test_per_position_scores_replay_the_tuners_calibration_where_its_walk_lands():
    target, head = near_bigram_pair(5, coupling=0.3)
    model = EaModel(target, head, settings=TreeSettings(total_token=8, depth=3, top_k=4))
    model.eos_ids = set()
    ids = calibration_prompts(model)[0]
    with torch.inference_mode():
        accepted, copied = per_position(model, ids, 40)
        cal = Calibration.over(list(SIZES), list(DEPTHS))
        cal.decode(model, ids, 8)
    big = accepted[(max(SIZES), max(DEPTHS))]
    assert len(big) == len(copied) == 39 and all(len(v) == 39 for v in accepted.values())
    landed, position = [], 0
    while len(landed) < 8:
        landed.append(position)
        position += big[position]
    for key in [(max(SIZES), max(DEPTHS)), (4, 2), (2, 1)]:
        assert [accepted[key][p] for p in landed] == cal.accepted[key]
    # the calibration's text ends after its 8th step (at `position`): its matches are cut there
    assert [min(copied[p], position - p) for p in landed] == cal.copied


def test_the_sampled_estimate_averages_where_the_largest_trees_walk_lands():
    largest = (max(SIZES), max(DEPTHS))
    scores = {largest: [2, 1, 3, 1, 1, 1], (2, 1): [2, 1, 2, 1, 1, 1]}
    texts = [(scores, [0, 0, 4, 0, 0, 0])]  # the largest tree's walk lands on positions 0, 2, 5
    assert sampled_tau(texts, 2, 1, 0, 48) == (2 + 2 + 1) / 3
    assert sampled_tau(texts, 2, 1, 6, 48) == (2 + 5 + 1) / 3  # the chain's 4 tokens at position 2
    assert sampled_tau(texts, 2, 1, 0, 2) == 2.0  # its first two steps only
    assert walk_tau(texts, 2, 1, 6) == 6 / 2  # the decoder itself: position 0 (+2), then 2 (+5), past the end
