"""experiments.chain_calibration replays the tuner's own calibration: the same accepted lengths and chain
matches as `tune_tree` on the same prompts, and the tuner's τ formula for a tree with a chain."""

import torch

from eagle.decoding.settings import TreeSettings
from eagle.model import EaModel
from eagle.tuning.tuner import calibration_prompts, tune_tree
from experiments.chain_calibration import calibrate, predicted_row
from tests.tiny import near_bigram_pair


def test_chain_calibration_replays_the_tuners_measurement():
    target, head = near_bigram_pair(5, coupling=0.3)
    model = EaModel(target, head, settings=TreeSettings(total_token=8, depth=3, top_k=4))
    prompts, steps = calibration_prompts(model)[:2], 10
    with torch.inference_mode():
        budget = tune_tree(model, prompts, steps_per_prompt=steps, repeats=1)
        accepted, copied = calibrate(model, prompts, steps)
    assert accepted == budget.accepted and copied == budget.copied
    assert len(copied) == 2 * steps and any(copied)  # the near-bigram target repeats itself: chains match
    row = predicted_row(accepted, copied)
    chained = {(r["total_token"], r["depth"], r["lookup"]): r["tau"] for r in budget.grid}
    assert f"16/3: {chained[(16, 3, 0)]:.2f} -> +4 {chained[(16, 3, 4)]:.2f} +8 {chained[(16, 3, 8)]:.2f}" in row
