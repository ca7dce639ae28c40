"""experiments.tree_calibration: its record of each position's pool scores trees as the tuner does, and its
per-depth calibration is a non-decreasing map into (0, 1]."""

import numpy as np
import torch

from eagle.decoding.settings import TreeSettings
from eagle.model import EaModel
from eagle.tuning.tuner import Calibration, calibration_prompts
from experiments.tree_calibration import BINS, accepted, calibration_table, fit_calibration, record_prompt, tau
from tests.tiny import near_bigram_pair


def test_recorded_pools_accept_what_the_tuners_calibration_measures():
    target, head = near_bigram_pair(5, coupling=0.3)
    model = EaModel(target, head, settings=TreeSettings(total_token=8, depth=3, top_k=4))
    model.eos_ids = set()
    prompts, positions = calibration_prompts(model)[:2], 20
    with torch.inference_mode():
        cal = Calibration.over([4, 8], [2, 3])
        for ids in prompts:
            cal.decode(model, ids, positions)
        runs = [record_prompt(model, ids, positions, depth=3, top_k=4) for ids in prompts]
    for n, d in ((4, 2), (8, 2), (8, 3)):
        assert [accepted(pool, pool["scores"], n, d) for pools in runs for pool in pools] == cal.accepted[(n, d)]
    assert tau([(runs, None)], 8, 3) > 1.0


def test_calibration_is_a_non_decreasing_chance_per_depth():
    target, head = near_bigram_pair(3, coupling=0.3)
    model = EaModel(target, head, settings=TreeSettings(total_token=8, depth=3, top_k=4))
    model.eos_ids = set()
    with torch.inference_mode():
        pools = record_prompt(model, calibration_prompts(model)[0], 24, depth=3, top_k=4)
    rows = calibration_table(pools, 3)
    assert {d for d, *_ in rows} == {1, 2, 3} and all(0.0 <= share <= 1.0 for *_, share, _ in rows)
    for d, table in fit_calibration(pools, 3).items():
        assert table.shape == (len(BINS) - 1,) and np.all(np.diff(table) >= 0) and np.all((table > 0) & (table <= 1))
