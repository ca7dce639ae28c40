"""evaluation/profile.py: the per-step breakdown of a decoder, on a tiny eager model."""

from __future__ import annotations

from eagle.decoding.settings import TreeSettings
from eagle.model import EaModel
from evaluation.profile import markdown, report
from tests.tiny import near_bigram_pair, prompt


def test_report_times_a_second_pass_and_breaks_a_step_into_its_phases(monkeypatch):
    target, head = near_bigram_pair(3)
    model = EaModel(target, head, settings=TreeSettings(total_token=6, depth=3, top_k=2), compile=False)
    prompts = [prompt(s, 5 + s) for s in range(2)]
    runs: list[int] = []
    generate = EaModel.eagenerate

    def counted(self, ids, **kw):
        runs.append(ids.shape[1])
        return generate(self, ids, **kw)

    monkeypatch.setattr(EaModel, "eagenerate", counted)
    r = report(model, prompts, max_new_tokens=12, profile_prompts=1)
    assert runs == [5, 6, 5, 6, 5]  # an untimed pass, the timed pass, then the profiled prompt
    assert r["steps"] > 0 and 1.0 <= r["tau"] <= 6 and r["ms_per_step"] > 0 and r["speedup"] > 0
    names = [name.strip() for name, _ in r["breakdown_ms"]]
    assert names[0] == "step" and {"draft", "verify.forward", "head.update", "other"} <= set(names)
    step_ms = r["breakdown_ms"][0][1]
    assert abs(step_ms - r["ms_per_step"]) < 1e-6 * step_ms  # the profiled shares scaled to unprofiled ms
    assert "| `step` |" in markdown(r)


def test_a_plain_budget_breaks_its_steps_into_the_target_forward():
    target, head = near_bigram_pair(3)
    model = EaModel(target, head, settings=TreeSettings(total_token=1, depth=1, top_k=2, lookup=0),
                    compile=False)
    r = report(model, [prompt(0, 5)], max_new_tokens=6, profile_prompts=1)
    names = [name.strip() for name, _ in r["breakdown_ms"]]
    assert names[:2] == ["step", "plain.forward"] and "draft" not in names
    assert r["tau"] == 1.0 and r["ms_per_step"] > 0
