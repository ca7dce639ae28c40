"""The tuner's calibration decoding (`eagle.tuning.tuner.Calibration`): it stops a prompt at its EOS, and
experiments.chain_calibration replays exactly what `tune_tree` measures."""

import torch

from eagle.decoding.settings import TreeSettings
from eagle.model import EaModel
from eagle.tuning.tuner import COMPILED_SIZES, Calibration, calibration_prompts, tune_tree
from experiments.chain_calibration import calibrate, predicted_row
from tests.tiny import near_bigram_pair


def test_calibration_stops_a_prompt_after_the_step_that_emits_an_eos():
    target, head = near_bigram_pair(3, coupling=0.3)
    model = EaModel(target, head, settings=TreeSettings(total_token=8, depth=3, top_k=4))
    model.eos_ids = set()
    ids = calibration_prompts(model)[0]
    with torch.inference_mode():
        free = Calibration.over([4, 8], [2, 3])
        new = free.decode(model, ids, 12).ids[0, ids.shape[1]:].tolist()
        assert len(free.rest_s) == len(free.copied) == 12
        eos = next(t for t in new[4:] if t not in new[:4])  # a token the reply first writes after a few steps
        model.eos_ids = {eos}
        ended = Calibration.over([4, 8], [2, 3])
        out = ended.decode(model, ids, 12).ids[0, ids.shape[1]:].tolist()
        steps = len(ended.rest_s)
        assert 1 < steps < 12 and len(ended.copied) == len(ended.accepted[(8, 3)]) == steps
        assert eos in out and out == new[: len(out)]  # the same greedy text, cut after the EOS's step
        shorter = Calibration.over([4, 8], [2, 3]).decode(model, ids, steps - 1).ids[0, ids.shape[1]:].tolist()
        assert eos not in shorter  # the step before had not written it


def test_chain_calibration_replays_the_tuners_measurement():
    target, head = near_bigram_pair(5, coupling=0.3)
    model = EaModel(target, head, settings=TreeSettings(total_token=8, depth=3, top_k=4))
    prompts, positions = calibration_prompts(model)[:2], 30
    with torch.inference_mode():
        budget = tune_tree(model, prompts, sizes=COMPILED_SIZES, positions_per_prompt=positions, repeats=1)
        cal = calibrate(model, prompts, positions)
    assert cal.accepted == budget.accepted and cal.copied == budget.copied and cal.ends == budget.ends == [30, 60]
    assert any(cal.copied)  # the near-bigram target repeats itself: chains match
    chained = {(r["total_token"], r["depth"], r["lookup"]): r["tau"] for r in budget.grid}
    assert f"8/3: +0 {chained[(8, 3, 0)]:.2f} +4 {chained[(8, 3, 4)]:.2f} +6 {chained[(8, 3, 6)]:.2f}" in predicted_row(cal)
    assert f"1/1: +4 {chained[(1, 1, 4)]:.2f}" in predicted_row(cal)

