"""End-to-end training on a tiny store: ZeRO 0/2/3, resume, export, W&B, CLI, torchrun.

The target is a tiny random Llama saved with save_pretrained (so resolve_target(path)
works) and the store holds its last hidden states over random token sequences.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file

from eagle.common.distributed import free_port
from data_prep.store import FeatureStore
from eagle.heads.checkpoint import load_head, save_head, write_draft_vocab
from eagle.heads.draft_vocab import ranked_ids
from tests.tiny import (ROOT, clean_env, kill_once_checkpointed, lock_held_elsewhere, tiny_llama, tiny_target_and_store,
                        write_tiny_store)
from train.checkpoints import step_tag
from train.config import validate
from train.stages import read_stages
from train.trainer import Trainer
from train.vocab_choice import main as vocab_main
from train.vocab_choice import token_counts

CONF = ROOT / "conf"
PY = sys.executable
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(target_dir, store_dir) shared by the tests of this module."""
    return tiny_target_and_store(tmp_path_factory.mktemp("tiny"))


def overrides(tiny, out: Path, *extra: str) -> list[str]:
    target, store = tiny
    return [
        "+model=smollm2_135m", f"model.path={target}", f"store_dir={store}", f"output_dir={out}",
        "wandb.mode=disabled", "train.batch_tokens=256", "train.lr=3e-3", "train.warmup_steps=3",
        "train.eval_fraction=0.2", "train.log_every=5", "train.eval_every=0", "train.save_every=0",
        "train.progress=false", "train.tau_every=0", *extra,  # the tiny target has no tokenizer for τ
    ]


def make_cfg(tiny, out: Path, *extra: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return validate(compose(config_name="config", overrides=overrides(tiny, out, *extra)))


@pytest.mark.parametrize("deepspeed, optimizer", [("zero0_bf16", "adamw"), ("zero2_bf16", "adamw"),
                                                  ("zero3_bf16", "adamw"), ("zero0_bf16", "muon")])
def test_loss_falls_with_each_zero_stage(tiny, tmp_path, deepspeed, optimizer):
    """Muon's step matches AdamW's update RMS in the long run (0.2 lr per element), a fifth of AdamW's
    first steps, hence its higher lr (1e-2 against 3e-3) in 30 steps."""
    trainer = Trainer(make_cfg(tiny, tmp_path, f"deepspeed={deepspeed}", "train.max_steps=30",
                               f"train.optimizer={optimizer}", "train.muon_lr=1e-2"))
    assert trainer.engine.zero_optimization_stage() == int(deepspeed[4])
    before = trainer.evaluate()
    result = trainer.fit()
    after = result.eval_metrics
    assert result.step == 30 and not result.stopped
    assert after["feature_loss"] < 0.92 * before["feature_loss"], (before, after)
    assert after["token_loss"] < before["token_loss"], (before, after)
    assert (tmp_path / "head" / "model.safetensors").exists()
    assert (tmp_path / "checkpoints" / "step00000030").is_dir()


def test_the_lk_token_loss_trains_toward_acceptance(tiny, tmp_path):
    """train.token_loss=lk on the tiny store: the held-out acceptance α = Σ min(p, q) rises."""
    trainer = Trainer(make_cfg(tiny, tmp_path, "train.max_steps=30", "train.token_loss=lk", "train.p_w=1.0"))
    before = trainer.evaluate()
    after = trainer.fit().eval_metrics
    assert after["accept"] > before["accept"] + 0.005, (before, after)  # a tiny random target: α starts at 0.93


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_resume_continues_at_same_step_with_same_batches(tiny, tmp_path, optimizer):
    """Stopped at step 4 and resumed == uninterrupted 8 steps: same batches, same weights (Muon's
    momentum and AdamW's moments come back with the checkpoint)."""
    common = ("train.max_steps=8", "train.save_every=2", "train.keep_last=2", "deepspeed=zero0_fp32",
              "train.export_dtype=float32", f"train.optimizer={optimizer}")
    straight = Trainer(make_cfg(tiny, tmp_path / "a", *common))
    straight.fit()

    first = Trainer(make_cfg(tiny, tmp_path / "b", *common, "train.stop_after=5"))
    stopped = first.fit()
    assert stopped.stopped and stopped.step == 5 and not (tmp_path / "b" / "head").exists()
    ckpts = sorted(p.name for p in (tmp_path / "b" / "checkpoints").glob("step*"))
    assert ckpts == ["step00000004", "step00000005"]  # keep_last=2 pruned step 2

    second = Trainer(make_cfg(tiny, tmp_path / "b", *common))
    assert second.step == 5  # train.resume=auto picked up the latest checkpoint
    second.fit()
    assert [*first.planned_batches(0, 5), *second.planned_batches(5, 3)] == list(straight.planned_batches(0, 8))
    a = load_file(str(tmp_path / "a" / "head" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "head" / "model.safetensors"))
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_export_epochs_writes_a_head_at_each_epoch_end_but_the_last(tiny, tmp_path):
    """train.export_epochs: epochs/epochN/head after epochs 1 and 2 of 3, each with its own step count
    and held-out metrics on its card; a run killed inside an epoch writes the heads of its epochs once resumed."""
    common = ("train.epochs=3", "deepspeed=zero0_fp32", "train.export_dtype=float32", "train.export_epochs=true")
    first = Trainer(make_cfg(tiny, tmp_path, *common, "train.save_every=1"))
    spe = first.steps_per_epoch
    assert first.total_steps == 3 * spe and spe >= 2
    first.cfg.train.stop_after = spe + 1  # killed in epoch 2: epoch 1's head is there, epoch 2's not yet
    assert first.fit().stopped
    epochs = tmp_path / "epochs"
    assert sorted(p.name for p in epochs.iterdir()) == ["epoch1"]
    result = Trainer(make_cfg(tiny, tmp_path, *common, "train.save_every=1")).fit()
    assert sorted(p.name for p in epochs.iterdir()) == ["epoch1", "epoch2"]  # the last epoch's is output_dir/head
    heads = [load_head(epochs / "epoch1" / "head"), load_head(epochs / "epoch2" / "head"), load_head(result.head_dir)]
    for n, head in enumerate(heads[:2], 1):
        assert read_stages(epochs / f"epoch{n}" / "head")[-1].steps == n * spe
        assert "eval_top1" in (epochs / f"epoch{n}" / "head" / "README.md").read_text()
    weights = [h.state_dict()["fc.weight"] for h in heads]
    assert not torch.equal(weights[0], weights[1]) and not torch.equal(weights[1], weights[2])


def test_resume_refuses_a_checkpoint_of_another_store(tiny, tmp_path):
    """A run folder keeps its store: resuming it over other data is a clear error, not a silent mix."""
    target, _ = tiny
    first = Trainer(make_cfg(tiny, tmp_path, "train.max_steps=6", "train.save_every=2", "train.stop_after=2"))
    assert first.fit().stopped
    other = tmp_path.parent / f"{tmp_path.name}-other-store"
    write_tiny_store(tiny_llama(seed=0), other, records=40, target_path=str(target))
    with pytest.raises(ValueError, match=r"trained on store store \(48 records\).*-other-store \(40 records\)"):
        Trainer(make_cfg((target, other), tmp_path, "train.max_steps=6", "train.save_every=2"))
    assert Trainer(make_cfg((target, other), tmp_path, "train.max_steps=6", "train.resume=none")).step == 0


def fp32_state(engine) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """name → (fp32 weight, AdamW's exp_avg), whatever the engine's precision and ZeRO stage."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    opt, out = engine.optimizer, {}
    if engine.zero_optimization_stage() in (1, 2):  # flat fp32 partitions; state linked to params only after a step
        return {f"group{i}": (flat.detach().clone(), opt.optimizer.state[flat]["exp_avg"].clone())
                for i, flat in enumerate(opt.single_partition_of_fp32_groups)}
    masters = {id(p): m for low, high in zip(getattr(opt, "fp16_groups", []), getattr(opt, "fp32_groups", []))
               for p, m in zip(low, high) if not engine.zero_optimization()}  # ZeRO-0 bf16: the wrapper's copies
    for name, p in engine.module.named_parameters():
        if id(p) in masters:
            out[name] = (masters[id(p)], opt.optimizer.state[masters[id(p)]]["exp_avg"])
        elif (w := safe_get_full_fp32_param(p)) is not None:
            out[name] = (w, safe_get_full_optimizer_state(p, "exp_avg"))
        else:
            out[name] = (p, opt.state[p]["exp_avg"])
    return {k: (w.detach().float().clone(), m.float().clone()) for k, (w, m) in out.items()}


@pytest.mark.parametrize("deepspeed, saved_bf16", [("zero0_bf16", True), ("zero0_bf16", False), ("zero2_bf16", True),
                                                   ("zero3_bf16", True)])
def test_a_run_resumes_in_the_other_precision(tiny, tmp_path, monkeypatch, deepspeed, saved_bf16):
    """A bf16 run continued on a CPU without bf16 arithmetic trains in fp32 there (and an fp32 run moved
    where bf16 is fast, in bf16): its fp32 weights, moments and schedule come back as saved."""
    from train import engine as engine_module

    as_asked, as_fp32 = (lambda dtype, device: dtype), (lambda dtype, device: torch.float32)
    common = (f"deepspeed={deepspeed}", "train.max_steps=6", "train.save_every=2")
    monkeypatch.setattr(engine_module, "fast_dtype", as_asked if saved_bf16 else as_fp32)
    first = Trainer(make_cfg(tiny, tmp_path, *common, "train.stop_after=2"))
    assert first.fit().step == 2 and first.engine.bfloat16_enabled() == saved_bf16
    saved, lr = fp32_state(first.engine), first.engine.get_lr()

    monkeypatch.setattr(engine_module, "fast_dtype", as_fp32 if saved_bf16 else as_asked)
    second = Trainer(make_cfg(tiny, tmp_path, *common))
    assert second.step == 2 and second.engine.bfloat16_enabled() != saved_bf16 and second.engine.get_lr() == lr
    for name, (weight, moment) in fp32_state(second.engine).items():
        assert torch.equal(weight, saved[name][0]), name
        assert torch.equal(moment, saved[name][1]), name
    assert second.fit().step == 6


def test_exported_head_reproduces_trained_module(tiny, tmp_path):
    trainer = Trainer(make_cfg(tiny, tmp_path, "train.max_steps=3", "wandb.mode=offline"))
    result = trainer.fit()
    head = load_head(result.head_dir, dtype=torch.bfloat16)
    module = copy.deepcopy(trainer.engine.module).eval().to(torch.bfloat16)  # fp32 on a CPU without bf16 arithmetic
    torch.manual_seed(0)
    h = head.config.hidden_size
    feats, embeds = torch.randn(2, 9, h).to(torch.bfloat16), torch.randn(2, 9, h).to(torch.bfloat16)
    pos = torch.arange(9).expand(2, -1)
    with torch.no_grad():
        assert torch.equal(head(feats, embeds, pos)[0], module(feats, embeds, pos)[0])
    card = (result.head_dir / "README.md").read_text()
    assert "EaModel.from_pretrained" in card and "top1" in card and str(tiny[0]) in card
    assert sorted(p.name for p in result.head_dir.iterdir()) == ["README.md", "config.json", "draft_vocab.json",
                                                                  "model.safetensors", "training.json"]
    assert set(load_file(str(result.head_dir / "model.safetensors"))) == set(head.state_dict())
    assert "## Serve" in card
    assert head.draft_ids is not None and head.draft_ids.numel() > 0  # training tokens, most frequent first
    assert list((tmp_path / "wandb").glob("offline-run-*")), "wandb offline run under output_dir"


def test_cli_prints_complete_config_for_vicuna(tmp_path):
    out = subprocess.run([PY, "-m", "train", "+model=vicuna7b", "--cfg", "job"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env=clean_env())
    assert out.returncode == 0, out.stderr
    assert "???" not in out.stdout and "lr: 3.0e-05" in out.stdout and "stage: 0" in out.stdout


@pytest.mark.slow
def test_cli_trains_end_to_end(tiny, tmp_path):
    out = subprocess.run([PY, "-m", "train", *overrides(tiny, tmp_path, "train.max_steps=4")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, env=clean_env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert "done: 4 steps" in out.stderr and (tmp_path / "head" / "config.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("deepspeed", ["zero2_bf16", "zero3_bf16"])
def test_torchrun_two_processes(tiny, tmp_path, deepspeed):
    env = clean_env(OMP_NUM_THREADS="1")
    cmd = [PY, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}", "-m", "train",
           *overrides(tiny, tmp_path, f"deepspeed={deepspeed}", "train.max_steps=4", "train.save_every=2")]
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "done: 4 steps" in out.stderr
    head = load_head(tmp_path / "head")
    assert head.config.hidden_size == 64
    ckpt = tmp_path / "checkpoints" / "step00000004"
    assert len(list(ckpt.glob("*optim_states.pt"))) == 2  # one optimizer shard per rank


def two_nodes(per_node: list[list[str]], cwd: Path, timeout: int = 300) -> list[subprocess.CompletedProcess]:
    """`torchrun --nnodes 2` on 127.0.0.1, one process per "node", each with its own arguments."""
    port, env = free_port(), clean_env(OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([PY, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={rank}",
                               "--nproc_per_node=1", "--master_addr=127.0.0.1", f"--master_port={port}", "-m", "train",
                               *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank, args in enumerate(per_node)]
    return [subprocess.CompletedProcess(p.args, p.wait(timeout), *p.communicate()) for p in procs]


@pytest.mark.slow
def test_two_nodes_without_a_shared_store_stop_with_one_line(tiny, tmp_path):
    """Each "node" sees its own store_dir (no shared filesystem): both stop at once with the same
    one-line error instead of one writing a store of half the shards or ranks hanging."""
    target, store = tiny
    local = tmp_path / "node1-disk"
    runs = two_nodes([overrides(tiny, tmp_path / "out"), overrides((target, local), tmp_path / "out")], tmp_path)
    for run in runs:
        assert run.returncode == 1, run.stderr[-3000:]
        line = next(x for x in run.stderr.splitlines() if x.startswith("error:"))
        assert "store_dir=" in line and "is not shared between the nodes" in line and "rank 1" in line


@pytest.mark.slow
def test_two_nodes_sharing_a_folder_train_and_resume(tiny, tmp_path):
    first = two_nodes([overrides(tiny, tmp_path / "out", "train.max_steps=4", "train.save_every=2",
                                 "train.stop_after=2")] * 2, tmp_path)
    assert all(r.returncode == 0 for r in first), first[0].stderr[-3000:]
    again = two_nodes([overrides(tiny, tmp_path / "out", "train.max_steps=4", "train.save_every=2")] * 2, tmp_path)
    assert all(r.returncode == 0 for r in again), again[0].stderr[-3000:]
    assert "done: 4 steps" in again[0].stderr and "resumed" in again[0].stdout + again[0].stderr


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2))
def test_resume_after_sigkill(tiny, tmp_path, seed):
    """A run SIGKILLed at a seeded point (once a seeded checkpoint is written; steps take milliseconds
    here, so the kill lands a few steps later) continues from its latest checkpoint with
    train.resume=auto and ends with an uninterrupted run's weights. Every run is a process of one
    thread: two-thread fp32 runs of the same command differed in the last bits now and then."""
    import random

    after = step_tag(random.Random(seed).randrange(6, 28, 3))
    common = ("train.max_steps=80", "train.save_every=3", "deepspeed=zero0_fp32", "train.export_dtype=float32")
    env = clean_env(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    straight, run_dir = tmp_path / "straight", tmp_path / "killed"
    for folder in (straight, run_dir):
        folder.mkdir()
    done = subprocess.run([PY, "-m", "train", *overrides(tiny, straight, *common)], cwd=straight, capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    args = [PY, "-m", "train", *overrides(tiny, run_dir, *common)]
    saved = kill_once_checkpointed(args, run_dir, run_dir / "checkpoints" / "latest", after, env=env)
    assert 6 <= saved < 80
    out = subprocess.run(args, cwd=run_dir, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"at step {saved}" in out.stdout + out.stderr  # Hydra's log handler writes to stdout
    assert "done: 80 steps" in out.stderr
    a = load_file(str(tmp_path / "straight" / "head" / "model.safetensors"))
    b = load_file(str(run_dir / "head" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_reduced_draft_vocabulary_and_init_head(tiny, tmp_path):
    """train.draft_vocab: the token loss runs over the N most frequent training tokens, the head
    stores them; train.init_head starts a run from an exported head's weights."""
    first = Trainer(make_cfg(tiny, tmp_path / "a", "train.max_steps=6", "train.draft_vocab=40"))
    assert first.loss_lm_head.shape == (40, first.frozen.lm_head.shape[1])
    counts = token_counts(first.records, first.train_idx, first.draft_config.vocab_size)
    ids = first.vocab.ids
    assert torch.equal(first.loss_lm_head, first.frozen.lm_head[ids[:40]])
    assert (counts[ids[:40]].min() >= counts[ids[40:]].max())  # the most frequent
    before = first.evaluate()
    result = first.fit()
    assert result.eval_metrics["token_loss"] < before["token_loss"]
    head = load_head(result.head_dir)
    assert torch.equal(head.draft_ids, ids[:40])

    second = Trainer(make_cfg(tiny, tmp_path / "b", "train.max_steps=1", f"train.init_head={result.head_dir}"))
    start = second.engine.module.state_dict()
    for key, value in head.state_dict().items():
        assert torch.equal(start[key].to(value.dtype), value), key


def test_a_head_trained_in_stages_keeps_every_stage(tiny, tmp_path):
    """A fine-tune's head records its starting head's stages and its own (training.json); its card
    lists them all, and a conversion to another layout carries them along."""
    from train.publish import convert
    from train.stages import STAGES_FILE

    first = Trainer(make_cfg(tiny, tmp_path / "a", "train.max_steps=2", "train.lr=0.001")).fit().head_dir
    (stage1,) = read_stages(first)
    assert (stage1.steps, stage1.records, stage1.lr) == (2, 48, 0.001) and stage1.tokens > 0
    second = Trainer(make_cfg(tiny, tmp_path / "b", "train.max_steps=1", "train.lr=0.0003",
                              f"train.init_head={first}")).fit().head_dir
    stages = read_stages(second)
    assert stages[0] == stage1 and (stages[1].steps, stages[1].lr) == (1, 0.0003) and len(stages) == 2
    assert " epochs, peak lr 0.0003)" in stages[1].line()
    card = (second / "README.md").read_text()
    assert "- Data, in 2 stages, each starting from the head the one before made:\n  1. `" in card
    assert f"  2. {stages[1].line()}\n- Started from: the head in `{first}`" in card
    converted = convert(second, "sglang", tmp_path / "sglang")
    assert (converted / STAGES_FILE).read_text() == (second / STAGES_FILE).read_text()


def test_a_stage_names_the_code_that_ran_not_the_code_at_export(tiny, tmp_path, monkeypatch):
    """A commit landing during a long run does not relabel it: the version is read when the run starts."""
    import train.trainer
    from train.stages import read_stages

    tree = {"commit": "abc-at-start"}
    monkeypatch.setattr(train.trainer, "code_version", lambda: tree["commit"])
    trainer = Trainer(make_cfg(tiny, tmp_path / "a", "train.max_steps=1"))
    tree["commit"] = "def-committed-meanwhile"
    head = trainer.fit().head_dir
    assert read_stages(head)[0].code_version == "abc-at-start"
    assert "- Code version: `abc-at-start`" in (head / "README.md").read_text()


def test_a_fine_tuned_heads_card_names_its_start():
    from train.export import CardInfo, model_card

    info = CardInfo(target="org/t", target_name="t", data="store", config={"init_head": "runs/a/head"})
    assert "- Started from: the head in `runs/a/head`" in model_card(info)
    assert "Started from" not in model_card(CardInfo(target="org/t", target_name="t", data="store", config={}))
    assert "base_model: org/t\n" in model_card(info) and "\n# EAGLE draft head for t\n" in model_card(info)


def test_the_card_names_the_hub_model_of_the_embedded_default_and_an_eagle3_head_as_such():
    """The alias means nothing on the Hub: the front matter, title and Training section name the Hub model."""
    from train.export import CardInfo, model_card

    card = model_card(CardInfo(target="smollm2-135m-instruct", target_name="smollm2-135m-instruct", data="store",
                               config={"head": "eagle3", "draft_vocab": 8}))
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct\n" in card  # the Hub's field takes Hub ids, not aliases
    assert "\n# EAGLE-3 draft head for SmolLM2-135M-Instruct\n" in card
    assert "- Target: `smollm2-135m-instruct` (HuggingFaceTB/SmolLM2-135M-Instruct on the Hub)\n" in card


def test_fine_tuning_keeps_the_starting_heads_vocabulary_beyond_the_stores_tokens(tiny, tmp_path):
    """A store that sees fewer distinct tokens than train.draft_vocab: the vocabulary is the
    store's tokens, most frequent first, then the starting head's tokens the store never saw."""
    first = Trainer(make_cfg(tiny, tmp_path / "a", "train.max_steps=1"))
    seen = first.vocab.ids  # the tiny store's tokens are ids >= 3: 0, 1 and 2 are never seen
    assert not torch.isin(torch.tensor([0, 1, 2]), seen).any()
    head_dir = first.fit().head_dir
    write_draft_vocab(head_dir, torch.cat([torch.tensor([2, 0, 1]), seen]))

    size = seen.numel() + 2
    second = Trainer(make_cfg(tiny, tmp_path / "b", "train.max_steps=1", f"train.init_head={head_dir}",
                              f"train.draft_vocab={size}"))
    assert torch.equal(second.vocab.ids, torch.cat([seen, torch.tensor([2, 0])]))
    assert torch.equal(second.loss_lm_head, second.frozen.lm_head[second.vocab.ids])
    assert torch.equal(load_head(second.fit().head_dir).draft_ids, second.vocab.ids)

    # the CLI's --keep: the head's own ids first, then the store's most frequent others, up to --size
    whole = ranked_ids(token_counts(FeatureStore(tiny[1])))  # the whole store's tokens, most frequent first
    write_draft_vocab(head_dir, torch.tensor([2, 0, 1]))
    vocab_main([str(tiny[1]), "--head", str(head_dir), "--size", "5", "--keep"])
    assert torch.equal(load_head(head_dir).draft_ids, torch.cat([torch.tensor([2, 0, 1]), whole[:2]]))
    vocab_main([str(tiny[1]), "--head", str(head_dir), "--keep"])  # no size: every seen token after them
    assert torch.equal(load_head(head_dir).draft_ids, torch.cat([torch.tensor([2, 0, 1]), whole]))


def test_fine_tuning_keeps_the_starting_heads_shape(tiny, tmp_path):
    """train.init_head with two decoder layers and a narrower MLP: the run trains that head as it is."""
    from transformers import AutoConfig

    from eagle.heads.eagle2 import DraftConfig, DraftHead

    cfg = DraftConfig.from_target_config(AutoConfig.from_pretrained(tiny[0]))
    cfg.num_hidden_layers, cfg.intermediate_size = 2, 48
    torch.manual_seed(0)
    start = save_head(tmp_path / "start", DraftHead(cfg), dtype=torch.float32)
    trainer = Trainer(make_cfg(tiny, tmp_path / "run", "train.max_steps=1", f"train.init_head={start}"))
    module = trainer.engine.module.state_dict()  # in the run's dtype (bf16)
    assert module["layers.1.mlp.down_proj.weight"].shape[1] == 48 and "layers.2.mlp.up_proj.weight" not in module
    for key, value in load_head(start).state_dict().items():
        assert torch.equal(module[key], value.to(module[key].dtype)), key


def test_training_time_test_trains(tiny, tmp_path):
    """train.ttt_steps=3 runs through DeepSpeed and lowers the loss; metrics stay the plain pass's."""
    trainer = Trainer(make_cfg(tiny, tmp_path, "train.max_steps=20", "train.ttt_steps=3", "train.draft_vocab=64"))
    before = trainer.evaluate()
    result = trainer.fit()
    assert result.eval_metrics["feature_loss"] < before["feature_loss"]
    assert result.train_metrics and set(before) == set(result.eval_metrics) - {k for k in result.eval_metrics if k.startswith("tau")}


@pytest.fixture(scope="module")
def tiny3(tmp_path_factory):
    """(target_dir, store_dir) of a store that also holds hidden_states[0] and [1] (EAGLE-3)."""
    return tiny_target_and_store(tmp_path_factory.mktemp("tiny3"), feature_layers=(0, 1, -1))


def test_eagle3_head_trains_exports_and_decodes_losslessly(tiny3, tmp_path):
    """head=eagle3: fused layers in, k-step training-time test, token loss over the draft
    vocabulary; the exported head loads as EAGLE-3 and decodes exactly like the target."""
    from eagle.heads.eagle3 import Eagle3Head
    from eagle.model import EaModel
    from eagle.decoding.settings import TreeSettings

    cfg = make_cfg(tiny3, tmp_path, "head=eagle3", "model.feature_layers=[0,1,-1]", "train.max_steps=25",
                   "train.ttt_steps=3", "train.draft_vocab=64")
    trainer = Trainer(cfg)
    assert trainer.eagle3 and trainer.vocab.ids.numel() == 64
    start = trainer.engine.module  # train.init_lm_head: the target's rows and final norm
    torch.testing.assert_close(start.lm_head.weight.float(), trainer.frozen.lm_head[trainer.vocab.ids].float())
    torch.testing.assert_close(start.norm.weight.float(), trainer.frozen.norm.float())
    before = trainer.evaluate()
    result = trainer.fit()
    assert result.eval_metrics["token_loss"] < before["token_loss"]
    assert result.eval_metrics["feature_loss"] == 0.0
    head = load_head(result.head_dir, dtype=torch.float32)
    assert isinstance(head, Eagle3Head) and head.config.feature_layers == [0, 1]
    assert torch.equal(head.draft_ids, trainer.vocab.ids)
    target = tiny_llama(seed=0)
    model = EaModel(target, head, settings=TreeSettings(total_token=10, depth=3, top_k=3))
    ids = torch.randint(3, 128, (1, 9), generator=torch.Generator().manual_seed(0))
    ref = target.generate(ids, do_sample=False, max_new_tokens=20, attention_mask=torch.ones_like(ids))
    assert torch.equal(model.eagenerate(ids, max_new_tokens=20), ref)


def test_an_eagle3_fine_tune_deepened_by_a_layer_starts_as_its_start_and_trains_it(tiny3, tmp_path):
    """train.head_layers=2 on a one-layer start: the step-0 head computes the start's drafts (the new
    layer adds zero), Muon then moves the new layer, and the export is a two-layer head that decodes
    losslessly."""
    from eagle.model import EaModel
    from eagle.decoding.settings import TreeSettings

    common = ("head=eagle3", "model.feature_layers=[0,1,-1]", "train.ttt_steps=2", "train.draft_vocab=64",
              "train.optimizer=muon", "train.lr=0.001", "train.warmup_steps=1")
    first = Trainer(make_cfg(tiny3, tmp_path / "a", *common, "train.max_steps=3")).fit().head_dir
    second = Trainer(make_cfg(tiny3, tmp_path / "b", *common, "train.max_steps=4", "train.head_layers=2",
                              f"train.init_head={first}"))
    start = load_head(first, dtype=torch.float32)
    module = second.engine.module
    layer = module.layers["1"]
    assert not layer.self_attn.o_proj.weight.any() and not layer.mlp.down_proj.weight.any()
    before = second.evaluate()
    result = second.fit()
    head = load_head(result.head_dir, dtype=torch.float32)
    assert head.config.num_hidden_layers == 2 and head.layers["1"].mlp.down_proj.weight.any()
    assert start.config.num_hidden_layers == 1 and result.eval_metrics["token_loss"] < before["token_loss"]
    target = tiny_llama(seed=0)
    model = EaModel(target, head, settings=TreeSettings(total_token=10, depth=3, top_k=3))
    ids = torch.randint(3, 128, (1, 9), generator=torch.Generator().manual_seed(1))
    ref = target.generate(ids, do_sample=False, max_new_tokens=16, attention_mask=torch.ones_like(ids))
    assert torch.equal(model.eagenerate(ids, max_new_tokens=16), ref)


def test_a_frozen_eagle3_lm_head_keeps_the_targets_rows_while_the_rest_trains(tiny3, tmp_path):
    """train.freeze_lm_head (speculators' default): only fc, the layer and the norms move."""
    cfg = make_cfg(tiny3, tmp_path, "head=eagle3", "model.feature_layers=[0,1,-1]", "train.max_steps=5",
                   "train.ttt_steps=2", "train.draft_vocab=64", "train.freeze_lm_head=true", "train.eagle3_norms=true")
    trainer = Trainer(cfg)
    fc = trainer.engine.module.fc.weight.detach().clone()
    result = trainer.fit()
    head = load_head(result.head_dir, dtype=torch.float32)
    rows = trainer.frozen.lm_head[head.draft_ids].float()
    torch.testing.assert_close(head.lm_head.weight, rows.to(torch.bfloat16).float())  # exported in bf16
    assert not torch.allclose(trainer.engine.module.fc.weight.detach(), fc)
    assert head.config.norm_before_fc and head.input_norm is not None


def test_an_eagle3_fine_tune_keeps_its_starting_heads_draft_tokens(tiny3, tmp_path):
    """train.init_head with an EAGLE-3 head whose draft tokens are not the store's most frequent:
    row i of its lm_head scores its own i-th token, so the run keeps those ids, in that order, and
    starts with the start's draft logits. It keeps the start's shape too: its 64 rows and its layer
    without speculators' norms, whatever train.draft_vocab and train.eagle3_norms say."""
    eagle3 = ("head=eagle3", "model.feature_layers=[0,1,-1]", "train.ttt_steps=2")
    first = Trainer(make_cfg(tiny3, tmp_path / "a", *eagle3, "train.max_steps=2", "train.draft_vocab=64",
                             "train.eagle3_norms=false"))
    head_dir = first.fit().head_dir
    ranked = first.vocab.ids
    shuffled = ranked[torch.randperm(64, generator=torch.Generator().manual_seed(0))]
    own = torch.cat([shuffled[:48], torch.arange(128)[~torch.isin(torch.arange(128), ranked)][:16]])  # 16 the store ranks lower
    start = load_head(head_dir)
    start.draft_ids = own  # as if trained on another store: row i scores own[i]
    save_head(head_dir, start, dtype=torch.float32)
    start = load_head(head_dir)

    second = Trainer(make_cfg(tiny3, tmp_path / "b", *eagle3, "train.max_steps=1", f"train.init_head={head_dir}",
                              "train.draft_vocab=96", "train.eagle3_norms=true"))
    assert second.draft_config.draft_vocab_size == 64 and not second.draft_config.norm_before_fc
    assert torch.equal(second.vocab.ids, start.draft_ids) and torch.equal(start.draft_ids.sort().values, own.sort().values)
    draft_ids, member = second.loss_vocab
    assert torch.equal(draft_ids, start.draft_ids) and int(member.sum()) == 64
    torch.testing.assert_close(second.engine.module.lm_head.weight.float(), start.lm_head.weight.float())
    assert torch.equal(load_head(second.fit().head_dir).draft_ids, start.draft_ids)


def test_an_eagle3_fine_tune_widens_an_lm_head_of_the_targets_rows(tiny3, tmp_path):
    """A start whose lm_head rows are the target's (train.freeze_lm_head, head=eagle3's default) grows to
    train.draft_vocab: its own tokens first with their rows as they were, so its drafts score as before,
    then the store's most frequent others with the target's rows. Unset (the whole vocabulary), it keeps
    its size."""
    eagle3 = ("head=eagle3", "model.feature_layers=[0,1,-1]", "train.ttt_steps=2")
    head_dir = Trainer(make_cfg(tiny3, tmp_path / "a", *eagle3, "train.max_steps=2", "train.draft_vocab=64")).fit().head_dir
    start = load_head(head_dir, dtype=torch.float32)

    second = Trainer(make_cfg(tiny3, tmp_path / "b", *eagle3, "train.max_steps=1", f"train.init_head={head_dir}",
                              "train.draft_vocab=96"))
    ids = second.vocab.ids
    assert second.draft_config.draft_vocab_size == 96 and ids.unique().numel() == 96
    assert torch.equal(ids[:64], start.draft_ids)
    lm_head = second.engine.module.lm_head.weight.detach().float()
    torch.testing.assert_close(lm_head[:64], start.lm_head.weight)
    # the target's rows in the run's dtype (fp32 on a CPU without bf16 arithmetic)
    torch.testing.assert_close(lm_head[64:], second.frozen.lm_head[ids[64:]].float())
    widened = second.fit().head_dir
    assert torch.equal(load_head(widened).draft_ids, ids)
    card = (widened / "README.md").read_text()  # each stage's size, and the widening, on the card
    assert "its weights; its draft vocabulary widened from 64 to 96 tokens" in card
    assert [s.draft_vocab for s in read_stages(widened)] == [64, 96] and "the draft vocabulary (96 tokens) covers" in card

    whole = Trainer(make_cfg(tiny3, tmp_path / "c", *eagle3, "train.max_steps=1", f"train.init_head={head_dir}",
                             "train.draft_vocab=null"))
    assert whole.draft_config.draft_vocab_size == 64


def test_a_frozen_lm_head_needs_a_start(tiny3, tmp_path):
    with pytest.raises(ValueError, match="init_lm_head"):
        Trainer(make_cfg(tiny3, tmp_path, "head=eagle3", "model.feature_layers=[0,1,-1]", "train.max_steps=1",
                         "train.freeze_lm_head=true", "train.init_lm_head=false"))


def test_eagle3_needs_a_store_with_its_layers(tiny, tmp_path):
    with pytest.raises(ValueError, match="prepare a store with head=eagle3"):
        Trainer(make_cfg(tiny, tmp_path, "head=eagle3", "model.feature_layers=[0,1,-1]", "train.max_steps=1"))


def test_the_step_statistics_stay_on_the_models_device(tiny, tmp_path):
    """On a GPU node the head, the frozen matrices and every batch are on CUDA: the trainer's losses
    and summed statistics must be too (a CPU `+=` of a CUDA loss, or a CPU tensor all-reduced by
    NCCL, fails on the first step there). tests/pseudo_cuda.py makes CUDA's device rules hold on
    this CPU; the held-out pass runs the same loss and statistics code as a training step."""
    import torch.distributed as dist

    from tests.pseudo_cuda import PseudoCuda

    trainer = Trainer(make_cfg(tiny, tmp_path, "train.max_steps=1", "deepspeed=zero0_fp32"))
    reduced = []
    real_all_reduce = dist.all_reduce

    def all_reduce(tensor, *args, **kwargs):  # what NCCL would be handed
        reduced.append(tensor.device)
        return real_all_reduce(tensor, *args, **kwargs)

    with PseudoCuda():
        cuda = torch.device("cuda")
        trainer.device, trainer.frozen = cuda, trainer.frozen.to(cuda)
        trainer.loss_lm_head = trainer.loss_lm_head.to(cuda)
        trainer.engine.module.to(cuda)
        dist.all_reduce, get_world_size = all_reduce, dist.get_world_size
        dist.get_world_size = lambda *a: 2  # take the multi-rank branch; the real group has one rank
        try:
            metrics = trainer.evaluate()
        finally:
            dist.all_reduce, dist.get_world_size = real_all_reduce, get_world_size
    assert 0 <= metrics["top1"] <= 1 and metrics["feature_loss"] > 0
    assert reduced and all(d.type == "cuda" for d in reduced)


def test_a_second_trainer_on_the_same_output_dir_stops_in_one_line(tiny, tmp_path):
    from eagle.common.locks import Busy
    from train.run import run

    out = tmp_path / "run"
    with lock_held_elsewhere(out, "training run") as holder:
        with pytest.raises(Busy, match=rf"another training run \(pid {holder.pid}\)"):
            run(make_cfg(tiny, out, "train.max_steps=1"))
    assert not (out / "checkpoints").exists()  # the refused trainer wrote nothing


def test_a_full_disk_in_the_middle_of_a_checkpoint_resumes_from_the_one_before(tiny, tmp_path, monkeypatch):
    """ENOSPC while checkpoint step 4's file is half written: the run stops; `latest` still names
    step 2, so the rerun resumes there and ends with the weights of an uninterrupted run."""
    common = ("train.max_steps=6", "train.save_every=2", "train.keep_last=2", "deepspeed=zero0_fp32",
              "train.export_dtype=float32")
    Trainer(make_cfg(tiny, tmp_path / "a", *common)).fit()
    real_save, calls = torch.save, []

    def disk_fills(obj, f, *args, **kwargs):
        calls.append(str(f))
        if "step00000004" in str(f):
            Path(f).write_bytes(b"PK\x03\x04 half a checkpoint")
            raise OSError(28, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_fills)
    with pytest.raises(OSError, match="No space"):
        Trainer(make_cfg(tiny, tmp_path / "b", *common)).fit()
    assert (tmp_path / "b" / "checkpoints" / "latest").read_text().strip() == "step00000002"
    assert any("step00000004" in c for c in calls)  # the partial checkpoint was begun
    monkeypatch.setattr(torch, "save", real_save)
    resumed = Trainer(make_cfg(tiny, tmp_path / "b", *common))
    assert resumed.step == 2
    resumed.fit()
    a = load_file(str(tmp_path / "a" / "head" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "head" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_malformed_stages_file_is_named_before_training(tiny, tmp_path):
    """A starting head whose training.json is not a list of stages fails at start, naming the file."""
    from train.stages import STAGES_FILE

    head_dir = Trainer(make_cfg(tiny, tmp_path / "a", "train.max_steps=1")).fit().head_dir
    (head_dir / STAGES_FILE).write_text('{"stages": [{"data": "x"}]}')
    with pytest.raises(ValueError, match=f"{head_dir / STAGES_FILE}: not a list of training stages"):
        Trainer(make_cfg(tiny, tmp_path / "b", "train.max_steps=1", f"train.init_head={head_dir}"))
