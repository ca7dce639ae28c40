"""τ by real decoding (train.judge) and its hook in the trainer, on tiny random models."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from data_prep.prompt_sets import held_back_prompts, load_questions
from eagle.heads.eagle2 import DraftConfig
from eagle.model import EaModel
from eagle.decoding.settings import TreeSettings
from tests.tiny import FIXED, bigram_head, random_head, tiny_llama, write_tiny_store
from train.config import validate
from train.judge import CHAIN, Judge, count_tau
from train.tracking import Tracker
from train.trainer import Trainer

CONF = Path(__file__).resolve().parent.parent / "conf"


def exact_bigram_pair(seed: int = 1):
    """A target whose next token depends only on the current one, and a head that knows it.

    Target layers add nothing (o_proj, down_proj = 0) and embeddings have rms 1, so the
    feature f_t = norm(embed(x_t)) = embed(x_t); lm_head is scaled up for peaked
    distributions. The head maps (embed(x_{t+1}), f_t) to embed(x_{t+1}) = f_{t+1}: every
    greedy draft is right, so a chain of 5 yields 6 tokens per target forward.
    """
    target = tiny_llama(seed)
    with torch.no_grad():
        for layer in target.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = torch.randn(target.model.embed_tokens.weight.shape, generator=torch.Generator().manual_seed(seed))
        target.model.embed_tokens.weight.copy_(emb / emb.pow(2).mean(-1, keepdim=True).sqrt())  # no zero pad row
        target.lm_head.weight.mul_(50.0)
    target.generation_config.eos_token_id = None  # no early stop: every prompt runs to the budget
    return target, bigram_head(target, seed)


def prompts(n: int, length: int = 7) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 128, (1, length + i), generator=g) for i in range(n)]


# ---- the τ function ---------------------------------------------------------------------------


def test_tau_counts_match_the_decoded_tokens_and_target_loads_once():
    target, head = tiny_llama(seed=2), random_head(tiny_llama(seed=2), seed=5)
    loads = []

    def load():
        loads.append(1)
        return target

    judge = Judge(prompts(3), load, max_new_tokens=20)
    first = judge.measure(head)
    second = judge.measure(head)
    assert len(loads) == 1
    assert set(first.counts) == {"tree", "chain"} and first.seconds > 0
    naive = EaModel(target, head, settings=FIXED)
    expected = sum(naive.naivegenerate(p, max_new_tokens=20).shape[1] - p.shape[1] for p in prompts(3))
    for name, count in first.counts.items():
        assert count.new_tokens == expected, name  # lossless: both trees emit the greedy reply
        assert 1.0 <= count.tau <= 6.0  # 5 drafts + 1 bonus at most, with depth 5
        assert second.counts[name] == count  # deterministic
    metrics = first.metrics()
    assert set(metrics) == {"tau_tree", "tau_chain", "tau_seconds"}
    assert metrics["tau_chain"] == first.counts["chain"].tau


def test_count_tau_sums_last_stats_per_prompt():
    target = tiny_llama(seed=2)
    model = EaModel(target, random_head(target), settings=TreeSettings(tree=CHAIN))
    count = count_tau(model, prompts(2), max_new_tokens=9)
    steps = 0
    for p in prompts(2):
        model.eagenerate(p, max_new_tokens=9)
        steps += model.last_stats.steps
    assert count.steps == steps and count.new_tokens == 2 * 9  # no EOS within 9 tokens here


def test_a_head_that_knows_the_target_gets_high_tau():
    target, head = exact_bigram_pair()
    counts = Judge(prompts(2), lambda: target, max_new_tokens=31).measure(head).counts
    assert counts["chain"].steps == 2 * 5 and counts["chain"].tau == pytest.approx(6.2)  # 1 + 5 steps x 6
    assert counts["tree"].tau > 3.0
    weak = Judge(prompts(2), lambda: target, max_new_tokens=31).measure(random_head(target)).counts
    assert weak["chain"].tau < 2.0


def test_measure_state_leaves_the_global_rng_alone():
    target = tiny_llama(seed=2)
    head = random_head(target)
    config = head.config
    judge = Judge(prompts(1), lambda: tiny_llama(seed=2), max_new_tokens=6)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    judge.measure_state(head.state_dict(), config)  # loads the target, builds a head: both draw
    assert torch.equal(torch.get_rng_state(), before)


def test_a_diverged_head_reports_nan_instead_of_decoding():
    target = tiny_llama(seed=2)
    state = random_head(target).state_dict()
    state["fc.weight"][0, 0] = float("nan")
    config = DraftConfig.from_target_config(target.config)
    metrics = Judge(prompts(1), lambda: target).measure_state(state, config).metrics()
    assert math.isnan(metrics["tau_tree"]) and math.isnan(metrics["tau_chain"])


def test_held_back_prompts_cover_mtbench_categories():
    try:
        texts = held_back_prompts("mtbench", 8)
    except FileNotFoundError as e:
        pytest.skip(str(e))

    by_text = {q.turns[0]: q.category for q in load_questions("mtbench")}
    assert len({by_text[t] for t in texts}) == 8
    assert held_back_prompts("mtbench", 8) == texts  # fixed order


# ---- the trainer hook -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chat_store(tiny_dir, tmp_path_factory):
    """A tiny store made by the tiny ChatML target (which has a tokenizer, so τ can run)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    out = tmp_path_factory.mktemp("tau_store")
    return write_tiny_store(model, out, records=24, max_len=32, target_path=str(tiny_dir))


def make_cfg(tiny_dir, store, out: Path, *extra: str):
    overrides = [
        "+model=smollm2_135m", f"model.path={tiny_dir}", f"store_dir={store}", f"output_dir={out}",
        "wandb.mode=disabled", "train.batch_tokens=128", "train.lr=3e-3", "train.warmup_steps=2",
        "train.eval_fraction=0.2", "train.log_every=5", "train.eval_every=0", "train.save_every=0",
        "train.progress=false", "deepspeed=zero0_fp32", "train.export_dtype=float32", "train.max_steps=5",
        "train.tau_num_prompts=2", "train.tau_max_new_tokens=8", *extra,
    ]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return validate(compose(config_name="config", overrides=overrides))


class RecordingRun:
    """Stands in for a wandb run: keeps what the trainer logs."""

    id = "recorded"

    def __init__(self):
        self.logged: list[tuple[int, dict]] = []
        self.summary: dict = {}

    def log(self, metrics: dict, step: int) -> None:
        self.logged.append((step, dict(metrics)))

    def finish(self) -> None:
        pass


def test_training_reports_tau_every_n_steps_and_at_the_end(tiny_dir, chat_store, tmp_path, monkeypatch, capsys):
    run = RecordingRun()
    monkeypatch.setattr(Trainer, "_tracker", lambda self: Tracker(run))
    trainer = Trainer(make_cfg(tiny_dir, chat_store, tmp_path / "tau", "train.tau_every=2", "train.tau_min_steps=0"))
    result = trainer.fit()
    assert [h["step"] for h in result.tau_history] == [2, 4, 5]
    assert all(h["tau_tree"] >= 1.0 and h["tau_chain"] >= 1.0 and h["tau_seconds"] > 0 for h in result.tau_history)
    assert {"tau_tree", "tau_chain", "tau_seconds", "top1"} <= set(result.eval_metrics)
    assert result.eval_metrics["tau_tree"] == result.tau_history[-1]["tau_tree"]
    assert [s for s, m in run.logged if "eval/tau_tree" in m] == [2, 4, 5]
    assert "eval/tau_chain" in run.summary
    assert "eval @ step 2: tau_chain=" in capsys.readouterr().out
    assert trainer.engine.module.training

    plain = Trainer(make_cfg(tiny_dir, chat_store, tmp_path / "plain", "train.tau_every=0"))
    assert plain.judge is None and plain.fit().tau_history == []
    a = load_file(str(tmp_path / "tau" / "head" / "model.safetensors"))
    b = load_file(str(tmp_path / "plain" / "head" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)  # measuring τ changes nothing in training


def test_tau_under_zero3_gathers_the_partitioned_weights(tiny_dir, chat_store, tmp_path):
    trainer = Trainer(make_cfg(tiny_dir, chat_store, tmp_path, "deepspeed=zero3_bf16", "train.max_steps=2",
                               "train.tau_every=1", "train.tau_min_steps=0", "train.export_dtype=bfloat16"))
    result = trainer.fit()
    assert [h["step"] for h in result.tau_history] == [1, 2]
    assert result.eval_metrics["tau_chain"] >= 1.0


@pytest.mark.slow
def test_torchrun_two_processes_zero3_reports_tau(tiny_dir, chat_store, tmp_path):
    """Rank 0 decodes while rank 1 waits at the barrier; both gather under ZeRO-3."""
    import subprocess
    import sys

    from eagle.common.distributed import free_port
    from tests.tiny import clean_env

    args = ["+model=smollm2_135m", f"model.path={tiny_dir}", f"store_dir={chat_store}", f"output_dir={tmp_path}",
            "wandb.mode=disabled", "train.batch_tokens=128", "train.max_steps=4", "train.eval_every=0",
            "train.save_every=0", "train.progress=false", "deepspeed=zero3_bf16", "train.tau_every=2", "train.tau_min_steps=0",
            "train.tau_num_prompts=2", "train.tau_max_new_tokens=8"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           "-m", "train", *args]
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
                         env=clean_env(OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr[-4000:]
    assert "eval @ step 2: tau_chain=" in out.stdout and "tau_tree=" in out.stderr  # step 2 line; final report


def test_tau_needs_a_chat_tokenizer(tmp_path):
    tiny_llama().save_pretrained(tmp_path / "bare")
    with pytest.raises(ValueError, match="tau_every=0"):
        Judge.from_target_dir(tmp_path / "bare", ["hi"])


def test_a_short_run_skips_tau_and_says_so(tiny_dir, chat_store, tmp_path, caplog):
    """train.tau_every > 0 on a run shorter than train.tau_min_steps: no judge, one line why."""
    import logging

    from train.judge import judge_wanted

    with caplog.at_level(logging.INFO, logger="train"):
        trainer = Trainer(make_cfg(tiny_dir, chat_store, tmp_path, "train.tau_every=2", "train.max_steps=3"))
    assert trainer.judge is None and not trainer.judging
    assert "τ judge skipped: 3 optimizer steps < train.tau_min_steps=500" in caplog.text
    assert trainer.fit().tau_history == []
    assert judge_wanted(2, 0, 3) and judge_wanted(2, 500, 500) and not judge_wanted(0, 0, 10**6)
