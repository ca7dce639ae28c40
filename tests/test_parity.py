"""The parity comparison (evaluation/parity.py): every run gets the same records, steps and draft
vocabulary; our trainer's runs report curves and speed; the judge scores heads alike; a rerun resumes.
The reference trainers' own small forms are tests/test_parity_speculators.py and test_parity_eagle_llm.py."""

from __future__ import annotations

import json
import socket

import pytest
import torch

from data_prep.store import FeatureStore
from eagle.heads.checkpoint import load_head
from evaluation import parity
from evaluation.parity_run import TrainerRun
from tests.tiny import tiny_target_and_store
from train.data import split_indices


@pytest.fixture(scope="module")
def tiny3(tmp_path_factory):
    """(target_dir, store_dir): a tiny random target and a 48-record EAGLE-3 store of it (layers 0, 1, last)."""
    return tiny_target_and_store(tmp_path_factory.mktemp("parity"), feature_layers=(0, 1, -1))


def tiny_args(tiny3, out, *extra):
    target, store = tiny3
    sets = [f"model.path={target}", "model.feature_layers=[0,1,-1]", "train.eval_fraction=0.05"]
    return ["--store", str(store), "--steps", "4", "--batch-tokens", "256", "--draft-vocab", "64", "--threads", "1",
            "--no-judge", "--out", str(out), *(a for s in sets for a in ("--set", s)), *extra]


@pytest.fixture
def after_an_in_process_run(monkeypatch):
    """What training in this process leaves behind: a group of one whose MASTER_PORT is still served."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        monkeypatch.setenv("MASTER_PORT", str(held.getsockname()[1]))
        for var, value in dict(MASTER_ADDR="127.0.0.1", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1").items():
            monkeypatch.setenv(var, value)
        yield


def test_every_run_shares_our_trainers_records_and_draft_vocabulary(tiny3, tmp_path, after_an_in_process_run):
    _, store = tiny3
    data = parity.ParityData.of(store, draft_vocab=64, batch_tokens=256, epochs=1, steps=None)
    train_idx, _ = split_indices(FeatureStore(store).lengths(), 0.05, 0)
    assert data.train_idx == train_idx and len(data.draft_ids) == 64 and data.steps > 1
    assert parity.main(tiny_args(tiny3, tmp_path, "--runs", "ours-eagle3@ours")) == 0
    run = TrainerRun.from_json(json.loads((tmp_path / "runs" / "ours-eagle3-ours" / "run.json").read_text()))
    head = load_head(run.head_dir, dtype=torch.float32)
    assert sorted(head.draft_ids.tolist()) == sorted(data.draft_ids)  # the trainer chose the same vocabulary
    assert run.recipe.steps == 4 and run.tokens > 0 and run.seconds > 0 and run.curve
    assert all(torch.isfinite(torch.tensor(p.loss)) for p in run.curve)
    assert (tmp_path / "results.md").exists() and (tmp_path / "curves.png").exists()


def test_the_reference_recipe_runs_our_trainer_and_a_rerun_reuses_finished_runs(tiny3, tmp_path, monkeypatch):
    """`ours-eagle3-norms@ref`: speculators' architecture variant and its documented recipe in our trainer."""
    assert parity.main(tiny_args(tiny3, tmp_path, "--runs", "ours-eagle3-norms@ref,ours-eagle2@ours")) == 0
    head = load_head(tmp_path / "runs" / "ours-eagle3-norms-ref" / "head", dtype=torch.float32)
    assert head.config.norm_before_fc and head.config.norm_output and head.input_norm is not None
    ref = parity.reference("speculators").reference_recipe(4, 256)
    run = json.loads((tmp_path / "runs" / "ours-eagle3-norms-ref" / "run.json").read_text())
    assert run["recipe"]["lr"] == ref.lr and run["recipe"]["ttt_steps"] == ref.ttt_steps
    monkeypatch.setattr(parity, "train_ours", lambda *a, **k: pytest.fail("a finished run was trained again"))
    assert parity.main(tiny_args(tiny3, tmp_path, "--runs", "ours-eagle3-norms@ref,ours-eagle2@ours")) == 0


@pytest.mark.slow
def test_the_judge_scores_a_shipped_head_by_position():
    """Our decoder's chain of 3 on the embedded default: τ is one plus the acceptance by position."""
    from evaluation.parity_judge import ParityJudge
    from tests.tiny import embedded_target_or_skip

    judge = ParityJudge(embedded_target_or_skip(), "mtbench", 2, 24, torch.float32, vllm=False)
    scores = judge.score(parity.Path(__file__).resolve().parent.parent / "checkpoints" / "eagle3-smollm2-135m-instruct")
    accept = scores["chain3_accept"]
    assert len(accept) == 3 and accept[0] >= accept[1] >= accept[2] >= 0
    assert scores["tree_tau"] >= 1 and scores["vllm_skipped"]
    assert abs(scores["chain3_tau"] - (1 + sum(accept))) < 0.15  # the last step of a reply may be cut short


def test_the_judges_measure_the_head_alone_without_the_default_lookup_chain():
    """The decoder's default adds a 10-token prompt-lookup chain; a head's τ (the trainer's judge, the parity
    judge, the serving check) must not: a chain of 3 then accepts at most 3 drafted tokens a step."""
    from eagle.decoding.settings import TreeSettings
    from eagle.model import EaModel
    from evaluation.parity_judge import judge_settings
    from tests.tiny import near_bigram_pair, prompt
    from train.judge import TREES

    assert TreeSettings().lookup > 0  # the default the judges must turn off
    settings = judge_settings(3)
    assert all(s.lookup == 0 for s in [*settings.values(), *TREES.values()])
    target, head = near_bigram_pair(3)
    ids = prompt(0, 12).repeat(1, 4)  # copies itself: a lookup chain would match
    model = EaModel(target, head, settings=settings["chain3"], compile=False)
    model.eagenerate(ids, max_new_tokens=32)
    assert max(model.last_stats.accept_lengths) <= 4


def test_a_cached_score_is_judged_again_once_its_head_folder_is_written_anew(tmp_path):
    """A new stage published into the folder a score was cached for gets its own score; a folder gone keeps its."""
    from evaluation.parity_judge import cached_scores

    head, path, judged = tmp_path / "head", tmp_path / "scores.json", []
    head.mkdir()
    (head / "config.json").write_text("{}")
    (head / "model.safetensors").write_bytes(b"stage 24")

    class Judge:
        def score(self, head_dir):
            judged.append(head_dir)
            return {"vllm_tau": float(len(judged))}

    first = cached_scores(path, {"h": head}, "mtbench", Judge)
    assert cached_scores(path, {"h": head}, "mtbench", Judge) == first and len(judged) == 1
    (head / "model.safetensors").write_bytes(b"stage 25")
    assert cached_scores(path, {"h": head}, "mtbench", Judge)["h"]["vllm_tau"] == 2.0
    for f in head.iterdir():
        f.unlink()
    assert cached_scores(path, {"h": head}, "mtbench", lambda: pytest.fail("judged"))["h"]["vllm_tau"] == 2.0


def test_scores_of_one_judge_are_cached_apart_from_both_and_no_judge_is_refused(tmp_path):
    base = ["--store", str(tmp_path), "--out", str(tmp_path / "out")]
    keys = {parity.judges_key(parity.parse_args(base + flags)) for flags in ([], ["--no-ours"], ["--no-vllm"])}
    assert len(keys) == 3
    with pytest.raises(SystemExit, match="no judge"):
        parity.main(base + ["--no-vllm", "--no-ours"])
