"""data_prep end to end on a tiny random target with the embedded default's tokenizer."""

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from transformers import AutoModelForCausalLM

from data_prep import pipeline, store
from data_prep.data_config import prep_config
from eagle.common.distributed import free_port
from data_prep.store import FeatureStore, read_manifest
from eagle.targets.tokenizer import load_tokenizer
from tests.tiny import crash_after
from tests.tiny import data_prep_config as config

CONF = str(Path(__file__).resolve().parents[1] / "conf")


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "chats.jsonl"
    rows = []
    for i in range(23):
        turns = [{"from": "human", "value": f"Question {i}: what is {i} plus {i}?"},
                 {"from": "gpt", "value": f"{i} plus {i} is {2 * i}. " * (1 + i % 4)}]
        if i % 5 == 0:
            turns = []  # counted as skipped
        rows.append({"id": str(i), "conversations": turns})
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def test_store_counts_mask_and_features(tiny_dir, chats, tmp_path):
    out = pipeline.prepare(config(tiny_dir, chats, tmp_path / "s"))
    m = read_manifest(out)
    assert m["complete"] and m["source"]["read"] == 23 and m["source"]["kept"] == 18
    assert m["source"]["skipped"] == {"empty": 5}
    assert len(m["shards"]) == m["expected_shards"] == 5
    store = FeatureStore(out)
    tok = load_tokenizer(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    for i in (0, 7, len(store) - 1):
        rec = store[i]
        with torch.no_grad():
            fresh = model(rec.input_ids[None], output_hidden_states=True).hidden_states[-1][0]
        assert (fresh - rec.hidden_states.float()).abs().max() < 1e-5
        text = tok.decode(rec.input_ids[rec.loss_mask])
        assert "plus" in text and "Question" not in text and "user" not in text and text.endswith("<|im_end|>")


def test_interrupted_run_resumes_and_matches(tiny_dir, chats, tmp_path, monkeypatch):
    whole = pipeline.prepare(config(tiny_dir, chats, tmp_path / "whole"))
    real = pipeline.write_shard
    monkeypatch.setattr(pipeline, "write_shard", crash_after(real, 2))
    cfg = config(tiny_dir, chats, tmp_path / "cut")
    with pytest.raises(KeyboardInterrupt):
        pipeline.prepare(cfg)
    partial = read_manifest(tmp_path / "cut")
    assert not partial["complete"] and len(partial["shards"]) == 2
    kept = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "cut").glob("shard-*")}
    monkeypatch.setattr(pipeline, "write_shard", real)
    hashed = []
    real_hash = store.sha256_file
    monkeypatch.setattr(store, "sha256_file", lambda path: hashed.append(path.name) or real_hash(path))
    pipeline.prepare(cfg)
    resumed = read_manifest(tmp_path / "cut")
    assert hashed == []  # kept shards keep their recorded entries; new ones are hashed as they are written
    for name, mtime in kept.items():
        assert (tmp_path / "cut" / name).stat().st_mtime_ns == mtime  # reused, not recomputed
    assert [s["sha256"] for s in resumed["shards"]] == [s["sha256"] for s in read_manifest(whole)["shards"]]


def test_store_goes_to_store_dir_not_the_run_folder(tiny_dir, chats, tmp_path):
    """Experiments set output_dir (their training run's folder); the store must still land in
    store_dir, where `python -m train` with the same overrides looks for it."""
    cfg = config(tiny_dir, chats, tmp_path / "store", **{"output_dir": tmp_path / "run", "data.limit": 3})
    assert pipeline.prepare(cfg) == tmp_path / "store"
    assert read_manifest(tmp_path / "store")["complete"] and not (tmp_path / "run").exists()


def test_other_settings_in_same_dir_are_refused(tiny_dir, chats, tmp_path):
    pipeline.prepare(config(tiny_dir, chats, tmp_path / "s", **{"data.limit": 4}))
    with pytest.raises(ValueError, match="other settings"):
        pipeline.prepare(config(tiny_dir, chats, tmp_path / "s", **{"data.limit": 5}))


def test_extra_feature_layers_are_stored(tiny_dir, chats, tmp_path):
    out = pipeline.prepare(config(tiny_dir, chats, tmp_path / "s", **{"model.feature_layers": "[1,-1]", "data.limit": 3}))
    rec = FeatureStore(out)[0]
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    with torch.no_grad():
        hs = model(rec.input_ids[None], output_hidden_states=True).hidden_states
    assert torch.allclose(rec.aux_hidden_states.float(), hs[1][0], atol=1e-5)
    assert torch.allclose(rec.hidden_states.float(), hs[-1][0], atol=1e-5)


def test_regenerated_replies_are_the_targets_own(tiny_dir, chats, tmp_path):
    cfg = config(tiny_dir, chats, tmp_path / "r", **{"data.limit": 6, "data.regenerate": "true", "data.regen.engine": "ours",
                                                     "data.regen.max_new_tokens": 8, "data.regen.batch_size": 3})
    out = pipeline.prepare(cfg)
    lines = [json.loads(x) for p in sorted((out / "regenerated").glob("chunk-*.jsonl")) for x in p.read_text().splitlines()]
    assert len(lines) == 4  # 6 read, 2 empty
    tok = load_tokenizer(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    first = lines[0]["messages"]
    prompt = tok.apply_chat_template(first[:1], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    greedy = model.generate(**prompt, max_new_tokens=8, do_sample=False)[0, prompt["input_ids"].shape[1]:]
    assert first[1]["content"] == tok.decode(greedy, skip_special_tokens=True).split("<|im_end|>")[0].strip()
    assert FeatureStore(out).manifest["source"]["regenerated"] is True


def test_a_store_mixes_a_regenerated_store_with_another_file(tiny_dir, chats, tmp_path):
    regen = pipeline.prepare(config(tiny_dir, chats, tmp_path / "r", **{
        "data.limit": 6, "data.regenerate": "true", "data.regen.engine": "ours", "data.regen.max_new_tokens": 8,
        "data.regen.batch_size": 3}))
    sources = f"[{regen / 'regenerated' / 'chunk-*.jsonl'},{chats}]"  # the override a user types
    mixed = pipeline.prepare(config(tiny_dir, chats, tmp_path / "m", **{"data.source": sources}))
    m = read_manifest(mixed)
    assert m["source"]["kept"] == 4 + 18 and len(m["source"]["parts"]) == 2  # one chunk (4 replies), then the file
    before, after = FeatureStore(regen), FeatureStore(mixed)
    for i in range(len(before)):  # the regenerated conversations come first, token for token
        assert torch.equal(after.tokens(i)[0], before.tokens(i)[0])
    with pytest.raises(ValueError, match="other settings"):  # another list is another store
        pipeline.prepare(config(tiny_dir, chats, tmp_path / "m", **{"data.source": f"[{chats}]"}))


def test_a_store_that_extends_another_reuses_its_whole_shards(tiny_dir, chats, tmp_path, monkeypatch):
    old = pipeline.prepare(config(tiny_dir, chats, tmp_path / "old"))  # 18 records: shards of 4, the last partial
    extra = tmp_path / "extra.jsonl"
    extra.write_text("\n".join(chats.read_text().splitlines()[:9]))
    sources = f"[{chats},{extra}]"
    plain = pipeline.prepare(config(tiny_dir, chats, tmp_path / "plain", **{"data.source": sources}))
    calls = []
    real = pipeline.compute_records
    monkeypatch.setattr(pipeline, "compute_records", lambda model, tokenized, *a: calls.append(len(tokenized)) or real(model, tokenized, *a))
    reused = pipeline.prepare(config(tiny_dir, chats, tmp_path / "reused", **{"data.source": sources, "data.reuse": f"[{old}]"}))
    a, b = read_manifest(plain), read_manifest(reused)
    assert [s["sha256"] for s in a["shards"]] == [s["sha256"] for s in b["shards"]]  # the same bytes
    assert b["source"] == a["source"] and b["throughput"]["reused_shards"] == 4  # the 4 whole shards of the 18 kept chats
    assert len(calls) == len(b["shards"]) - 4
    assert (tmp_path / "reused" / "shard-00000.safetensors").stat().st_ino == (old / "shard-00000.safetensors").stat().st_ino


def test_a_store_with_loops_masked_takes_its_features_from_the_unmasked_store(tiny_dir, chats, tmp_path, monkeypatch):
    """data.mask_repeats changes the masks, not the features: a store of the same chats gives them."""
    old = pipeline.prepare(config(tiny_dir, chats, tmp_path / "old"))
    monkeypatch.setattr(pipeline, "compute_records", lambda *a: pytest.fail("a target forward for reused features"))
    new = pipeline.prepare(config(tiny_dir, chats, tmp_path / "new", **{"data.mask_repeats": 4, "data.reuse": f"[{old}]"}))
    a, b = FeatureStore(old), FeatureStore(new)
    assert b.manifest["throughput"]["reused_shards"] == len(b.manifest["shards"])
    assert b.manifest["loss_tokens"] < a.manifest["loss_tokens"]  # the replies "i plus i is 2i. " * k repeat
    for i in range(len(a)):
        ra, rb = a[i], b[i]
        assert torch.equal(ra.input_ids, rb.input_ids) and torch.equal(ra.hidden_states, rb.hidden_states)
        assert not (rb.loss_mask.bool() & ~ra.loss_mask.bool()).any()  # a subset of the reply tokens
    assert [s["sha256"] for s in b.manifest["shards"]] == [store.shard_entry(new / s["file"])["sha256"] for s in b.manifest["shards"]]
    assert pipeline.config_key(prep_config(config(tiny_dir, chats, tmp_path / "x", **{"data.mask_repeats": 4}))) != \
        pipeline.config_key(prep_config(config(tiny_dir, chats, tmp_path / "x")))


def test_a_store_for_another_target_or_unfinished_is_not_reused(tiny_dir, chats, tmp_path, caplog):
    old = pipeline.prepare(config(tiny_dir, chats, tmp_path / "old", **{"data.limit": 8}))
    with caplog.at_level("WARNING", logger="data_prep"):
        new = pipeline.prepare(config(tiny_dir, chats, tmp_path / "new", **{"data.limit": 8, "model.max_len": 512,
                                                                           "data.reuse": f"[{old}]"}))
        pipeline.prepare(config(tiny_dir, chats, tmp_path / "x", **{"data.limit": 8, "data.reuse": f"[{tmp_path / 'none'}]"}))
    assert "differs from this store in max_len" in caplog.text and read_manifest(new)["throughput"]["reused_shards"] == 0
    assert f"not reusing {tmp_path / 'none'}: it is not a complete feature store" in caplog.text  # computed instead


def test_a_glob_that_finds_one_more_file_is_another_store(tiny_dir, chats, tmp_path):
    (tmp_path / "a-1.jsonl").write_text(chats.read_text())
    cfg = config(tiny_dir, chats, tmp_path / "s", **{"data.source": f"[{tmp_path / 'a-*.jsonl'}]"})
    key = pipeline.config_key(prep_config(cfg))
    assert key == pipeline.config_key(prep_config(cfg))
    (tmp_path / "a-2.jsonl").write_text(chats.read_text())
    assert pipeline.config_key(prep_config(cfg)) != key  # so prepare() refuses to finish the old store with new data
    plain = config(tiny_dir, chats, tmp_path / "s")
    assert pipeline.config_key(prep_config(plain)) == pipeline.config_key(prep_config(config(
        tiny_dir, chats, tmp_path / "s", **{"data.source": str(chats)})))


@pytest.mark.slow
def test_two_ranks_split_shards_and_merge(tiny_dir, chats, tmp_path):
    import os
    import subprocess
    import sys

    single = pipeline.prepare(config(tiny_dir, chats, tmp_path / "one"))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           "-m", "data_prep", "+model=smollm2_135m", f"model.path={tiny_dir}", "model.dtype=float32",
           f"data.source={chats}", "data.shard_records=4", "data.batch_tokens=256", f"store_dir={tmp_path / 'two'}"]
    subprocess.run(cmd, check=True, env=env, cwd=tmp_path, timeout=300, capture_output=True)
    two = read_manifest(tmp_path / "two")
    assert two["complete"] and two["source"]["kept"] == read_manifest(single)["source"]["kept"]
    assert [s["sha256"] for s in two["shards"]] == [s["sha256"] for s in read_manifest(single)["shards"]]


def test_the_plan_predicts_the_store_and_refuses_a_disk_too_small(tiny_dir, chats, tmp_path, monkeypatch):
    from data_prep import plan

    cfg = config(tiny_dir, chats, tmp_path / "s")
    predicted = plan.store_plan(prep_config(cfg))
    assert predicted.conversations_source == "read from the source" and "tokenized" in predicted.tokens_source
    pipeline.prepare(cfg)
    real = sum(p.stat().st_size for p in (tmp_path / "s").glob("shard-*.safetensors"))
    assert abs(predicted.store_bytes - real) / real < 0.10  # headers and offsets are the rest
    monkeypatch.setattr(plan, "_free", lambda path: 1000)
    with pytest.raises(ValueError, match="needs about .* GB more .* bigger disk") as err:
        pipeline.prepare(config(tiny_dir, chats, tmp_path / "t"))
    assert "\n" not in str(err.value) and not list((tmp_path / "t").glob("shard-*"))  # before any forward


def test_the_plan_of_a_gpu_preset_works_offline(monkeypatch, tmp_path):
    from huggingface_hub import constants

    from data_prep.plan import store_plan
    from train.config import validate
    from train.training_plan import training_plan

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = compose(config_name="config", overrides=["+model=llama3_8b_instruct", "head=eagle3",
                                                        f"store_dir={tmp_path}"])
    p = store_plan(prep_config(cfg))
    assert p.target.source == "the preset" and p.conversations == 68000 and p.tokens == 68000 * 1300
    assert p.bytes_per_token == 5 + 2 * 4096 * 4  # EAGLE-3: the last layer and three fused ones, bf16
    text = "\n".join(p.lines())
    assert "DOES NOT FIT" in text or p.fits
    assert not any("train device" in line for line in p.lines())  # data_prep plans its own side
    trained = training_plan(validate(cfg)).lines()
    assert trained[:len(p.lines())] == p.lines() and any("train device" in line for line in trained)


RESOLVERS = ("resolve_target", "local_target", "load_tokenizer")  # model.path -> a folder; a folder -> a tokenizer


@pytest.fixture
def resolutions(monkeypatch):
    """Counts, by function, the target resolutions and tokenizer loads of data_prep and train (each
    module's imported name is wrapped: the modules call them as plain names)."""
    import importlib
    import pkgutil
    import sys
    from collections import Counter

    import data_prep
    import train

    for package in (data_prep, train):
        for info in pkgutil.iter_modules(package.__path__):
            if info.name != "__main__":
                importlib.import_module(f"{package.__name__}.{info.name}")
    counts = Counter()
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] not in ("data_prep", "train"):
            continue
        for fn in RESOLVERS:
            real = getattr(module, fn, None)
            if callable(real):
                monkeypatch.setattr(module, fn, lambda *a, _real=real, _fn=fn, **k: counts.update([_fn]) or _real(*a, **k))
    return counts


def test_a_data_prep_job_resolves_its_target_once(tiny_dir, chats, tmp_path, resolutions):
    """`python -m data_prep`: one resolution and one tokenizer for the plan, the reading and the features;
    the plan alone looks the target up once, without converting or downloading it."""
    from data_prep.plan import store_plan

    cfg = config(tiny_dir, chats, tmp_path / "s")
    pipeline.prepare(cfg)
    assert dict(resolutions) == {"resolve_target": 1, "load_tokenizer": 1}
    resolutions.clear()
    pipeline.prepare(cfg)  # complete: nothing to resolve
    assert not resolutions
    store_plan(prep_config(config(tiny_dir, chats, tmp_path / "t")))
    assert dict(resolutions) == {"local_target": 1, "load_tokenizer": 1}
