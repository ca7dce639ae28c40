"""Online training (train.features=online): the target runs inside the training step, no store.

The records, the batch plan and the features are the store's (data_prep/tokens.py, train/feature_source.py),
so an online run and an offline run of the same settings train the same head; the target never
enters the DeepSpeed engine; a killed online run resumes with the same batches.
"""

import json

import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file

from data_prep import pipeline
from data_prep.data_config import prep_config, resolve
from data_prep.store import FeatureStore
from data_prep.tokens import token_records
from tests.test_pipeline import resolutions  # noqa: F401 (a fixture)
from tests.tiny import CONF
from train.config import validate
from train.data import collate
from train.tracking import read_metrics
from train.trainer import Trainer


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    path = tmp_path_factory.mktemp("online-data") / "chats.jsonl"
    rows = []
    for i in range(40):
        turns = [{"from": "human", "value": f"Question {i}: what is {i} times {i % 7}?"},
                 {"from": "gpt", "value": f"{i} times {i % 7} is {i * (i % 7)}. " * (1 + i % 5)}]
        if i % 3 == 0:
            turns += [{"from": "human", "value": "And doubled?"}, {"from": "gpt", "value": f"{2 * i * (i % 7)}."}]
        rows.append({"id": str(i), "conversations": turns})
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def cfg_for(tiny_dir, chats, store, out, *extra):
    overrides = ["+model=smollm2_135m", f"model.path={tiny_dir}", "model.dtype=float32", f"data.source={chats}",
                 "data.shard_records=8", "data.batch_tokens=512", f"store_dir={store}", f"output_dir={out}",
                 "wandb.mode=disabled", "deepspeed=zero0_fp32", "train.export_dtype=float32",
                 "train.batch_tokens=256", "train.lr=3e-3", "train.warmup_steps=3", "train.eval_fraction=0.2",
                 "train.log_every=1", "train.eval_every=0", "train.save_every=0", "train.progress=false",
                 "train.tau_every=0", *extra]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return validate(compose(config_name="config", overrides=overrides))


def cli_overrides(tiny_dir, chats, tmp_path, *extra) -> list[str]:
    """`python -m train` arguments of an online run into tmp_path/run (tmp_path/store must stay unwritten)."""
    return ["+model=smollm2_135m", f"model.path={tiny_dir}", "model.dtype=float32", f"data.source={chats}",
            "data.shard_records=8", f"store_dir={tmp_path / 'store'}", f"output_dir={tmp_path / 'run'}",
            "wandb.mode=disabled", "train.features=online", "train.batch_tokens=256", "train.progress=false",
            "train.tau_every=0", "train.eval_fraction=0.2", *extra]


@pytest.fixture(scope="module")
def store(tiny_dir, chats, tmp_path_factory):
    """The offline store of the same settings: fp32 features, each record run through the target alone
    (data.batch_tokens=1), as online training with train.batch_tokens=1 runs it."""
    where = tmp_path_factory.mktemp("online-store") / "store"
    pipeline.prepare(cfg_for(tiny_dir, chats, where, where.parent / "unused", "data.batch_tokens=1"))
    return where


def test_online_records_and_features_are_the_stores(tiny_dir, chats, store, tmp_path):
    """Same records in the same order; the same features bit for bit when the forward sees the same
    shapes (one record alone), and within fp32 rounding in a padded batch (the forward is not
    batch-invariant: padding changes the last bits of attention and matmuls)."""
    cfg = cfg_for(tiny_dir, chats, store, tmp_path, "train.features=online")
    prep = prep_config(cfg)
    records, stored = token_records(prep, resolve(prep.model)), FeatureStore(store)
    assert records.lengths() == stored.lengths() and records.source["kept"] == len(stored)
    for i in range(len(stored)):
        assert all(torch.equal(a, b) for a, b in zip(records.tokens(i), stored.tokens(i), strict=True)), i
    features = Trainer(cfg).features
    for i in (0, 5, len(stored) - 1):
        assert torch.equal(features.fill(collate([records[i]])).hidden, collate([stored[i]]).hidden), i
    batch = collate([records[i] for i in range(6)])
    filled, offline = features.fill(batch), collate([stored[i] for i in range(6)])
    torch.testing.assert_close(filled.hidden, offline.hidden, rtol=0, atol=2e-6)
    assert filled.hidden[batch.input_ids == 0].abs().sum() == 0  # padding is zero, as collated from a store


def test_an_online_run_trains_the_offline_runs_head(tiny_dir, chats, store, tmp_path):
    """Record by record (train.batch_tokens=2), online and offline runs see bit-identical features:
    the same losses at every step and the same head."""
    common = ("train.batch_tokens=2", "train.max_steps=12")
    offline = Trainer(cfg_for(tiny_dir, chats, store, tmp_path / "off", *common)).fit()
    online = Trainer(cfg_for(tiny_dir, chats, store, tmp_path / "on", *common, "train.features=online")).fit()
    curve_off, curve_on = read_metrics(tmp_path / "off"), read_metrics(tmp_path / "on")
    assert sorted(curve_off) == list(range(1, 13))
    for step in curve_off:
        for key in ("train/feature_loss", "train/token_loss", "train/top1"):
            assert curve_on[step][key] == curve_off[step][key], (step, key)
    assert online.eval_metrics == offline.eval_metrics
    a, b = (load_file(str(tmp_path / run / "head" / "model.safetensors")) for run in ("off", "on"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_killed_online_run_resumes_with_the_same_batches(tiny_dir, chats, store, tmp_path):
    """No store to lean on: the batches come from (seed, step) alone. Stopped at step 5 and resumed, the
    run logs the uninterrupted run's losses at steps 6-10 and ends with its head."""
    common = ("train.features=online", "train.max_steps=10", "train.save_every=5")
    Trainer(cfg_for(tiny_dir, chats, store, tmp_path / "straight", *common)).fit()
    assert Trainer(cfg_for(tiny_dir, chats, store, tmp_path / "cut", *common, "train.stop_after=5")).fit().stopped
    resumed = Trainer(cfg_for(tiny_dir, chats, store, tmp_path / "cut", *common))
    assert resumed.step == 5
    resumed.fit()
    straight, cut = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "cut")
    for step in range(1, 11):
        assert cut[step]["train/feature_loss"] == straight[step]["train/feature_loss"], step
    a, b = (load_file(str(tmp_path / run / "head" / "model.safetensors")) for run in ("straight", "cut"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_target_stays_out_of_the_engine(tiny_dir, chats, store, tmp_path):
    """The engine (optimizer, ZeRO partitions, checkpoints) holds the head alone; the target gets no
    gradient, and its embedding is the frozen matrix the loss reads (no second copy)."""
    trainer = Trainer(cfg_for(tiny_dir, chats, store, tmp_path, "train.features=online", "train.max_steps=2",
                              "train.save_every=2"))
    target = trainer.features.target
    before = {k: v.clone() for k, v in target.state_dict().items()}
    trainer.fit()
    head_params = {id(p) for p in trainer.engine.module.parameters()}
    optimized = {id(p) for group in trainer.engine.optimizer.param_groups for p in group["params"]}
    assert optimized <= head_params and not any(id(p) in optimized for p in target.parameters())
    assert all(p.grad is None and not p.requires_grad for p in target.parameters())
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())
    assert trainer.frozen.embed.data_ptr() == target.get_input_embeddings().weight.data_ptr()
    saved = torch.load(next((tmp_path / "checkpoints" / "step00000002").glob("*model_states.pt")), weights_only=False)
    head_size = sum(p.numel() for p in trainer.engine.module.parameters())
    assert sum(v.numel() for v in saved["module"].values()) == head_size


def test_an_eagle3_head_trains_online(tiny_dir, chats, tmp_path):
    """head=eagle3 online: the fused layers and the target's distribution come from the live forward."""
    cfg = cfg_for(tiny_dir, chats, tmp_path / "no-store", tmp_path, "train.features=online", "head=eagle3",
                  "model.feature_layers=[0,1,-1]", "train.max_steps=15", "train.draft_vocab=null", "train.ttt_steps=2")
    trainer = Trainer(cfg)
    batch = trainer.features.fill(collate([trainer.records[i] for i in range(3)]))
    assert batch.aux.shape[-1] == 2 * batch.hidden.shape[-1]
    before = trainer.evaluate()
    result = trainer.fit()
    assert result.eval_metrics["token_loss"] < before["token_loss"]
    assert not (tmp_path / "no-store").exists()  # nothing written where a store would be


def test_online_features_stay_on_the_models_device(tiny_dir, chats, store, tmp_path):
    """On a GPU the batch's ids are on CUDA and its lengths on the CPU (Batch.to keeps them there): the
    padding mask must be built on the ids' device. tests/pseudo_cuda.py enforces CUDA's device rules."""
    from tests.pseudo_cuda import PseudoCuda

    trainer = Trainer(cfg_for(tiny_dir, chats, store, tmp_path, "train.features=online", "train.max_steps=1"))
    with PseudoCuda():
        cuda = torch.device("cuda")
        trainer.features.target.to(cuda)
        batch = trainer.features.fill(collate([trainer.records[i] for i in range(4)]).to(cuda))
    assert batch.hidden.device.type == "cuda" and batch.hidden.shape[:2] == batch.input_ids.shape


def test_the_throughput_tool_times_online_against_a_bare_target_and_head(tiny_dir, chats, store, tmp_path):
    from experiments.train_throughput import measure

    result = measure(cfg_for(tiny_dir, chats, store, tmp_path, "train.features=online"), steps=3, warmup=1)
    assert result["features"] == "online" and result["trainer_tokens_per_s"] > 0 and result["bare_tokens_per_s"] > 0


def test_cli_trains_online_without_a_store(tiny_dir, chats, tmp_path):
    """`python -m train ... train.features=online`: no data_prep, no store folder, a head at the end."""
    import subprocess
    import sys

    from tests.tiny import clean_env

    args = cli_overrides(tiny_dir, chats, tmp_path, "train.max_steps=3")
    out = subprocess.run([sys.executable, "-m", "train", *args], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300, env=clean_env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert "done: 3 steps" in out.stderr and (tmp_path / "run" / "head" / "config.json").exists()
    assert not (tmp_path / "store").exists()
    card = (tmp_path / "run" / "head" / "README.md").read_text()
    assert "online" in card


@pytest.mark.slow
def test_two_ranks_train_online_under_zero2(tiny_dir, chats, tmp_path):
    """torchrun, 2 processes, gloo, ZeRO-2: each rank loads its own target, tokenizes half the slices and
    gets all of them, and trains on its half of every epoch's batches."""
    import subprocess
    import sys

    from eagle.common.distributed import free_port
    from tests.tiny import clean_env

    args = cli_overrides(tiny_dir, chats, tmp_path, "deepspeed=zero2_bf16", "train.max_steps=4", "train.save_every=2")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           "-m", "train", *args]
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env=clean_env(OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr[-4000:]
    assert "done: 4 steps" in out.stderr and "over 2 rank(s)" in out.stdout  # logging goes to stdout
    assert len(list((tmp_path / "run" / "checkpoints" / "step00000004").glob("*optim_states.pt"))) == 2
    assert not (tmp_path / "store").exists()


def test_online_reads_regenerated_replies_from_the_reply_cache(tiny_dir, chats, tmp_path, monkeypatch):
    """data.regenerate=true online: the replies come from store_dir/regenerated (written once, by either
    mode), the features from the live target; the records are the regenerated store's."""
    from data_prep import regenerate

    regen = ("data.limit=6", "data.regenerate=true", "data.regen.max_new_tokens=8", "data.regen.batch_size=3",
             "data.regen.engine=ours")
    where = tmp_path / "store"
    pipeline.prepare(cfg_for(tiny_dir, chats, where, tmp_path / "unused", *regen))
    monkeypatch.setattr(regenerate, "ReplyGenerator", None)  # a second generation would fail here
    prep = prep_config(cfg_for(tiny_dir, chats, where, tmp_path, *regen))
    records, stored = token_records(prep, resolve(prep.model)), FeatureStore(where)
    assert records.source["regenerated"] and records.lengths() == stored.lengths()
    assert all(torch.equal(records.tokens(i)[0], stored.tokens(i)[0]) for i in range(len(stored)))


@pytest.mark.slow
def test_an_online_run_sigkilled_mid_epoch_resumes_with_the_same_losses(tiny_dir, chats, tmp_path):
    """A real kill: SIGKILL once step 9's checkpoint is written (a few steps later, mid-epoch), then the same
    command again. The resumed run logs the uninterrupted run's loss at every step and ends with its head."""
    import subprocess
    import sys

    from tests.tiny import clean_env, kill_once_checkpointed

    common = ("train.max_steps=40", "train.save_every=3", "deepspeed=zero0_fp32", "train.export_dtype=float32",
              "train.log_every=1")
    straight = tmp_path / "straight"
    straight.mkdir()
    args = [sys.executable, "-m", "train", *cli_overrides(tiny_dir, chats, straight, *common)]
    assert subprocess.run(args, cwd=straight, capture_output=True, timeout=300, env=clean_env()).returncode == 0
    killed = tmp_path / "killed"
    killed.mkdir()
    args = [sys.executable, "-m", "train", *cli_overrides(tiny_dir, chats, killed, *common)]
    saved = kill_once_checkpointed(args, killed, killed / "run" / "checkpoints" / "latest", "step00000009")
    out = subprocess.run(args, cwd=killed, capture_output=True, text=True, timeout=300, env=clean_env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"at step {saved}" in out.stdout and "done: 40 steps" in out.stderr
    a, b = read_metrics(straight / "run"), read_metrics(killed / "run")
    assert all(a[s]["train/feature_loss"] == b[s]["train/feature_loss"] for s in range(1, 41))
    heads = [load_file(str(d / "run" / "head" / "model.safetensors")) for d in (straight, killed)]
    assert all(torch.equal(heads[0][k], heads[1][k]) for k in heads[0])


@pytest.mark.parametrize("features", ["store", "online"])
def test_a_training_job_resolves_its_target_once(tiny_dir, chats, tmp_path, resolutions, features):
    """`python -m train` with its store missing (or online) and τ on: data_prep, the features, the head's
    sizes and the τ judge share one resolution of model.path and one tokenizer."""
    from train.run import run

    run(cfg_for(tiny_dir, chats, tmp_path / "store", tmp_path / "run", f"train.features={features}",
                "train.max_steps=2", "train.tau_every=2", "train.tau_num_prompts=1", "train.tau_max_new_tokens=4"))
    assert dict(resolutions) == {"resolve_target": 1, "load_tokenizer": 1}


def test_a_card_names_a_store_in_the_home_directory_under_tilde():
    """The card's data line names the store without the user's home directory (it goes to the Hub)."""
    from pathlib import Path

    from train.feature_source import StoreFeatures

    assert StoreFeatures(None, str(Path.home() / "stores" / "s")).describe() == "~/stores/s"
    assert StoreFeatures(None, "/srv/stores/s").describe() == "/srv/stores/s"
    assert StoreFeatures(None, "stores/s").describe() == "stores/s"
