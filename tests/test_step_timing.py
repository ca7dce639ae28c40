"""The tuner's real-step timing (eagle/tuning/step_timing.py): which rows it times, how, and that only
they are chosen from."""

import torch

from eagle.decoding.settings import TreeSettings
from eagle.model import EaModel
from eagle.tuning import step_timing
from eagle.tuning.tuner import _same_tree, calibration_prompts, tune_tree
from tests.tiny import near_bigram_pair


def test_the_best_rows_of_each_chain_band_are_timed_as_decoding_and_only_they_are_chosen(monkeypatch):
    target, head = near_bigram_pair(5, coupling=0.3)
    model = EaModel(target, head, settings=TreeSettings(total_token=8, depth=3, top_k=4))
    decoded = []
    step = model.step
    monkeypatch.setattr(model, "step", lambda state, tree, *a: decoded.append(model.settings) or step(state, tree, *a))
    with torch.inference_mode():
        budget = tune_tree(model, calibration_prompts(model)[:2], sizes=(2, 4, 8, 16), depths=(1, 2, 3),
                           positions_per_prompt=20, repeats=2)
    timed = [r for r in budget.grid if r["timed"] and r["total_token"] + r["lookup"] > 1]
    for low, high in step_timing.CHAIN_BANDS:
        band = [r for r in budget.grid if low <= r["lookup"] <= high and r["total_token"] + r["lookup"] > 1]
        ranked = sorted(band, key=lambda r: -r["tau"] / r.get("parts_ms", r["ms_per_step"]))  # as the parts rank
        assert {id(r) for r in ranked[: step_timing.SHORTLIST]} <= {id(r) for r in timed}
    assert all(r["ms_per_step"] > 0 and r["parts_ms"] > 0 for r in timed)
    for tree in [r for r in timed if not r["lookup"]]:  # each timed tree alone also with its best chain
        chained = [r for r in budget.grid if _same_tree(r, tree) and r["lookup"]]  # none when n + L > 16
        assert not chained or max(chained, key=lambda r: r["tau"] / r.get("parts_ms", r["ms_per_step"]))["timed"]
    # each timed row decoded real steps with its own settings: TIMED_STEPS of the one timed prompt of these two
    # (step_timing.TIMED_PROMPTS), in a warm-up round and one more
    keys = {(s.total_token, s.depth, s.lookup) for s in decoded}
    assert {(r["total_token"], r["depth"], r["lookup"]) for r in timed} == keys
    assert len(decoded) == len(keys) * step_timing.TIMED_STEPS * 1 * 2
    assert model.settings.total_token == 8 and model.settings.depth == 3  # the model's own settings are back
    plain = next(r for r in budget.grid if r["total_token"] == 1 and not r["lookup"])
    assert plain["timed"] and plain["parts_ms"] == budget.plain_ms  # plain steps timed beside them, too
    pick = next(r for r in budget.grid if (r["total_token"], r["depth"], r["lookup"]) ==
                (budget.total_token, budget.depth, budget.lookup))
    assert pick["timed"]
