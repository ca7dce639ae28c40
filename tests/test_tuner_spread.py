"""`python -m evaluation.tuner_spread`: its timing runs never share the machine with a background warm-up."""

import torch

from eagle.heads.checkpoint import save_head
from eagle.model import EaModel
from eagle.tuning.tuner import TreeBudget
from evaluation import tuner_spread
from tests.tiny import near_bigram_pair


def test_tuner_spread_times_without_a_background_warmup(tmp_path, monkeypatch):
    target, head = near_bigram_pair(4)
    target.save_pretrained(tmp_path / "target")
    save_head(tmp_path / "head", head, dtype=torch.float32)
    seen = []

    def tune(model, reuse=True, **kwargs):  # records what would run beside the timing
        seen.append((model.warmup, reuse))
        return TreeBudget(8, 2, 1.0, [], {}, {}, 0.0)

    monkeypatch.setattr(EaModel, "tune", tune)
    monkeypatch.setenv("EAGLE_COMPILE", "1")  # a compiled model is one a background warm-up would compile
    budgets = tuner_spread.main(["--base", str(tmp_path / "target"), "--head", str(tmp_path / "head"),
                                 "--dtype", "float32", "--runs", "2"])
    assert [(b.total_token, b.depth) for b in budgets] == [(8, 2)] * 2
    assert seen == [(None, False)] * 2
