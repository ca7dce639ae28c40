"""experiments.tree_ab: its configurations as settings, its report, and the dtype its target computes in."""

import torch

from eagle.common.precision import fast_dtype
from eagle.decoding.settings import TreeSettings
from experiments import diagnostic_prompts
from experiments.tree_ab import PLAIN, report, settings_of


def test_configurations_name_the_tuned_pick_a_variant_of_it_or_fixed_settings():
    tuned = TreeSettings().tuned(8, 3, 6)
    assert settings_of("tuned", tuned) == tuned
    assert (settings_of("tuned+0", tuned).total_token, settings_of("tuned+0", tuned).lookup) == (8, 0)
    fixed = settings_of("4/2+4", tuned)
    assert (fixed.total_token, fixed.depth, fixed.lookup, fixed.top_k) == (4, 2, 4, tuned.top_k)
    assert settings_of("2/1", tuned).lookup == 0


def test_the_report_compares_each_prompt_with_its_own_plain_decoding(capsys):
    plain = [{"tok_s": 100.0, "tokens": 100, "seconds": 1.0, "tau": 1.0, "step_ms": 10.0, "new": [1, 2]},
             {"tok_s": 50.0, "tokens": 100, "seconds": 2.0, "tau": 1.0, "step_ms": 20.0, "new": [3]}]
    fast = [{"tok_s": 150.0, "tokens": 150, "seconds": 1.0, "tau": 2.0, "step_ms": 13.0, "new": [1, 2]},
            {"tok_s": 100.0, "tokens": 100, "seconds": 1.0, "tau": 3.0, "step_ms": 30.0, "new": [4]}]
    report("set", {PLAIN: plain, "4/2+4": fast}, 2)
    out = capsys.readouterr().out
    # ratios 1.5 and 2.0 per prompt; over both, 250 tokens in 2 s against 200 in 3 s
    assert "| 4/2+4 | 125.0 | 1.75 | 125.0 | 1.87 | 2.50 | 21.5 | 1/2 |" in out


def test_the_target_computes_in_the_dtype_decoding_uses(monkeypatch):
    """bf16 only where the CPU has bf16 arithmetic: emulated bf16 made an AVX2 CPU's plain steps 1.6x slower."""
    loaded = []
    monkeypatch.setattr(diagnostic_prompts, "resolve_target", lambda base: base)
    monkeypatch.setattr(diagnostic_prompts, "load_tokenizer", lambda path: None)
    monkeypatch.setattr(diagnostic_prompts, "load_target", lambda path, dtype: loaded.append(dtype))
    ap = diagnostic_prompts.parser("doc", "prog")
    for argv, dtype in (([], fast_dtype("auto")), (["--dtype", "float32"], torch.float32)):
        diagnostic_prompts.setup(ap.parse_args(argv + ["--per-category", "0", "--sharegpt", "0"]))
        assert loaded.pop() == dtype
