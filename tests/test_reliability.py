"""Reliability: fuzzed chat files, damaged files on resume, bad decoder inputs: each ends clean or in one line.

The fuzz cases come from tests/fuzz_inputs.py (seeded); `python -m tests.fuzz_inputs` prints
the table docs/reliability.md quotes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from data_prep import pipeline
from data_prep.conversations import DataError, read_conversations
from data_prep.store import read_manifest, shard_name
from eagle.heads.checkpoint import load_head, save_head
from eagle.model import EaModel
from tests.fuzz_inputs import KINDS, judge, make_case
from tests.tiny import (
    ROOT,
    TREES,
    clean_env,
    crash_after,
    data_prep_config,
    lock_held_elsewhere,
    near_bigram_pair,
    prompt,
)

CASES_PER_KIND = 40


@pytest.mark.parametrize("kind", KINDS)
def test_fuzzed_chat_files_read_clean_or_fail_in_one_line(kind, tmp_path):
    outcomes = [judge(make_case(kind, seed, tmp_path)) for seed in range(CASES_PER_KIND)]
    assert len(outcomes) == CASES_PER_KIND  # judge raised on anything but these two
    if kind in ("unknown_role", "empty_turn", "huge", "duplicate_id", "truncate"):
        assert set(outcomes) == {"clean"}  # nothing wrong with the rest of such a file


# ---- the four reported cases --------------------------------------------------------------


CHATS = [{"id": "a", "conversations": [{"from": "human", "value": "Un café, s'il vous plaît."},
                                       {"from": "gpt", "value": "Voilà."}]},
         {"id": "b", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]}]


def test_a_latin1_file_names_file_record_field_and_the_fix(tmp_path):
    path = tmp_path / "latin1.json"
    path.write_bytes(json.dumps(CHATS[::-1], ensure_ascii=False).encode("latin-1"))
    with pytest.raises(DataError) as e:
        read_conversations(str(path))
    message = str(e.value)
    assert str(path) in message and "record 1" in message and "conversations[0].value" in message
    assert "byte 0xe9" in message and "iconv" in message and "\n" not in message


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-32"])
@pytest.mark.parametrize("suffix", ["json", "jsonl"])
def test_a_byte_order_mark_is_accepted(tmp_path, encoding, suffix):
    path = tmp_path / f"chats.{suffix}"
    text = json.dumps(CHATS, ensure_ascii=False) if suffix == "json" else "\n".join(
        json.dumps(c, ensure_ascii=False) for c in CHATS)
    path.write_bytes(text.encode(encoding))
    conversations, report = read_conversations(str(path))
    assert report.kept == 2 and conversations[0].messages[0]["content"] == "Un café, s'il vous plaît."


def _config(tiny_dir, source, out):
    return data_prep_config(tiny_dir, source, out, **{"data.shard_records": 2})


def test_a_file_with_no_usable_conversation_is_an_error_not_an_empty_store(tiny_dir, tmp_path):
    path = tmp_path / "unusable.json"
    path.write_text(json.dumps([{"conversations": [{"from": "system", "value": "Be brief."}]},
                                {"conversations": [{"from": "human", "value": "only a question"}]}]))
    with pytest.raises(DataError, match=r"no usable conversation: read 2, kept 0; skipped by reason: "
                                        r"1 empty, 1 no assistant reply"):
        pipeline.prepare(_config(tiny_dir, path, tmp_path / "store"))
    assert read_manifest(tmp_path / "store") is None  # nothing marked complete


def test_data_prep_refuses_the_trainers_keys_by_name():
    for arg, meant in (("output_dir=/tmp/x", "store_dir"), ("train.lr=1e-4", "python -m train")):
        proc = subprocess.run([sys.executable, "-m", "data_prep", "+model=smollm2_135m", arg], cwd=ROOT,
                              capture_output=True, text=True, env=clean_env(), timeout=120)
        assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1 and meant in proc.stderr


# ---- faults on resume ---------------------------------------------------------------------


def test_a_shard_cut_after_an_interruption_is_written_again(tiny_dir, tmp_path, monkeypatch):
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join(json.dumps({"conversations": [
        {"from": "human", "value": f"What is {i} times 3?"}, {"from": "gpt", "value": f"{3 * i}, " * (i + 1)}]})
        for i in range(8)))
    whole = pipeline.prepare(_config(tiny_dir, path, tmp_path / "whole"))
    real = pipeline.write_shard
    monkeypatch.setattr(pipeline, "write_shard", crash_after(real, 2))
    cfg = _config(tiny_dir, path, tmp_path / "cut")
    with pytest.raises(KeyboardInterrupt):
        pipeline.prepare(cfg)
    shard = tmp_path / "cut" / shard_name(1)
    shard.write_bytes(shard.read_bytes()[:1000])  # the disk lost its tail
    monkeypatch.setattr(pipeline, "write_shard", real)
    pipeline.prepare(cfg)
    resumed, reference = read_manifest(tmp_path / "cut"), read_manifest(whole)
    assert resumed["complete"] and [s["sha256"] for s in resumed["shards"]] == [s["sha256"] for s in reference["shards"]]


# ---- decoder inputs -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def model():
    target, head = near_bigram_pair(1)
    return EaModel(target, head, None, TREES["dynamic"])


BAD_CALLS = {
    "empty prompt": (dict(input_ids=torch.zeros(1, 0, dtype=torch.long)), "empty"),
    "longer than the positions": (dict(input_ids=prompt(0, 600)), "at most 512 positions"),
    "ids outside the vocabulary": (dict(input_ids=torch.tensor([[5, 999]])), "outside the target's vocabulary"),
    "negative max_new_tokens": (dict(max_new_tokens=-1), "max_new_tokens=-1"),
    "negative temperature": (dict(temperature=-1.0), "temperature=-1.0"),
    "NaN temperature": (dict(temperature=float("nan")), "temperature=nan"),
    "top_p above 1": (dict(temperature=0.7, top_p=1.5), "top_p=1.5"),
    "negative top_p": (dict(temperature=0.7, top_p=-0.1), "top_p=-0.1"),
    "fractional top_k": (dict(temperature=0.7, top_k=2.5), "top_k=2.5"),
    "a batch of two": (dict(input_ids=prompt(0, 5).repeat(2, 1)), "batch size 1"),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
@pytest.mark.parametrize("method", ["eagenerate", "naivegenerate"])
def test_bad_decoder_inputs_are_one_line_errors(model, name, method):
    kwargs, expected = BAD_CALLS[name]
    kwargs = {"input_ids": prompt(0, 5), "max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=expected) as e:
        getattr(model, method)(**kwargs)
    assert "\n" not in str(e.value)


def test_zero_new_tokens_returns_the_prompt(model):
    ids = prompt(0, 5)
    assert torch.equal(model.eagenerate(ids, max_new_tokens=0), ids)


@pytest.mark.parametrize("damage", ["weights cut", "config cut", "config not an object"])
def test_a_damaged_head_folder_is_one_line(tmp_path, damage):
    _, head = near_bigram_pair(2)
    folder = save_head(tmp_path / "head", head, dtype=torch.float32)
    if damage == "weights cut":
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "config cut":
        (folder / "config.json").write_text((folder / "config.json").read_text()[:100])
    else:
        (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError) as e:
        load_head(folder)
    assert str(folder) in str(e.value) and "\n" not in str(e.value)


def test_the_harness_catches_a_reader_that_refuses_or_changes_valid_data(tmp_path, monkeypatch):
    """The judge is not a test that cannot fail."""
    from data_prep import conversations

    case = make_case("duplicate_id", 0, tmp_path)
    assert judge(case) == "clean"
    real = conversations._records

    def refuse(path, label, split, report):
        raise DataError(label, 0, "", "refused")
        yield

    monkeypatch.setattr(conversations, "_records", refuse)
    with pytest.raises(AssertionError, match="nothing is wrong with this data"):
        judge(case)

    def accents_lost(path, label, split, report):
        for index, record in real(path, label, split, report):
            yield index, json.loads(json.dumps(record).replace("\\u00e9", "e"))

    monkeypatch.setattr(conversations, "_records", accents_lost)
    with pytest.raises(AssertionError, match="changed silently"):
        judge(make_case("unknown_role", 3, tmp_path))


# ---- one writer per folder ----------------------------------------------------------------


def test_a_second_data_prep_on_the_same_store_stops_in_one_line(tiny_dir, tmp_path):
    """A data_prep process holds the store; a second one, started meanwhile, refuses at once."""
    from eagle.common.locks import Busy, exclusive

    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps(CHATS[1]))
    with lock_held_elsewhere(tmp_path / "store", "data_prep store") as holder:
        with pytest.raises(Busy, match=rf"another data_prep store \(pid {holder.pid}\)"):
            pipeline.prepare(_config(tiny_dir, path, tmp_path / "store"))
    with exclusive(tmp_path / "store", "data_prep store"):  # the kill released it: no stale lock
        pass
    assert read_manifest(tmp_path / "store") is None  # the refused run wrote nothing


# ---- kills at seeded points, and folders it cannot write ----------------------------------


def _chats(path, n=10):
    path.write_text("\n".join(json.dumps({"conversations": [
        {"from": "human", "value": f"What is {i} times 7?"}, {"from": "gpt", "value": f"{7 * i}. " * (i + 2)}]})
        for i in range(n)))
    return path


def _data_prep(tiny_dir, source, store):
    return [sys.executable, "-m", "data_prep", "+model=smollm2_135m", f"model.path={tiny_dir}", "model.dtype=float32",
            f"data.source={source}", "data.shard_records=2", "data.batch_tokens=128", f"store_dir={store}"]


@pytest.mark.parametrize("seed", range(3))
def test_data_prep_killed_at_a_seeded_point_resumes_to_the_same_store(tiny_dir, tmp_path, seed):
    import random
    import signal
    import time

    source = _chats(tmp_path / "chats.jsonl")
    whole = pipeline.prepare(_config(tiny_dir, source, tmp_path / "whole"))
    rng = random.Random(seed)
    shards_before_kill, extra_ms = rng.randrange(0, 4), rng.uniform(0, 150)
    store = tmp_path / "cut"
    proc = subprocess.Popen(_data_prep(tiny_dir, source, store), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=clean_env())
    try:
        deadline = time.time() + 120
        while proc.poll() is None and time.time() < deadline and len(list(store.glob("shard-*"))) < shards_before_kill:
            time.sleep(0.01)
        time.sleep(extra_ms / 1000)
        assert proc.poll() is None, "the run ended before the kill point"
        os.kill(proc.pid, signal.SIGKILL)  # alive: before its first shard, between shards or before its manifest
    finally:
        proc.wait(timeout=30)
    for shard in store.glob("shard-*.safetensors"):  # whatever the kill left that looks whole, is whole
        from safetensors import safe_open

        with safe_open(str(shard), framework="pt"):
            pass
    done = subprocess.run(_data_prep(tiny_dir, source, store), cwd=ROOT, capture_output=True, text=True,
                          env=clean_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [s["sha256"] for s in read_manifest(store)["shards"]] == [s["sha256"] for s in read_manifest(whole)["shards"]]


def test_a_store_folder_it_cannot_create_is_one_line(tiny_dir, tmp_path):
    source = _chats(tmp_path / "chats.jsonl", 2)
    (tmp_path / "a-file").write_text("not a folder")
    proc = subprocess.run(_data_prep(tiny_dir, source, tmp_path / "a-file" / "store"), cwd=ROOT, capture_output=True,
                          text=True, env=clean_env(), timeout=120)
    assert proc.returncode != 0 and proc.stderr.strip().startswith("error: ")
    assert len(proc.stderr.strip().splitlines()) == 1 and "a-file" in proc.stderr


def test_an_export_interrupted_while_writing_leaves_the_earlier_one_whole(tmp_path, monkeypatch):
    from eagle.heads import checkpoint

    _, head = near_bigram_pair(2)
    folder = save_head(tmp_path / "head", head, dtype=torch.float32)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "save_file", full_disk)
    with pytest.raises(OSError, match="No space"):
        save_head(folder, head, dtype=torch.bfloat16)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head"]  # no temp folder left behind


def test_an_exported_head_is_readable_as_the_umask_allows(tmp_path):
    """The atomic export's temp folder (mkdtemp: 0700) and safetensors' file (0600) are renamed into
    place with the modes a plain mkdir/open would give: a team sharing the disk can read the head."""
    _, head = near_bigram_pair(2)
    old = os.umask(0o022)
    try:
        folder = save_head(tmp_path / "head", head, dtype=torch.float32, card="card")
    finally:
        os.umask(old)
    assert folder.stat().st_mode & 0o777 == 0o755
    assert {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()} == {
        name: 0o644 for name in ("README.md", "config.json", "model.safetensors")}


@pytest.mark.parametrize("seed", range(3))
def test_an_export_killed_at_a_seeded_point_never_leaves_a_folder_that_looks_whole(tmp_path, seed):
    """A process re-exporting a head in a loop is SIGKILLed at a seeded moment: the folder named
    like the head is absent or loads whole; leftovers are only dot-named temp folders."""
    import random
    import signal
    import time

    code = ("import torch\nfrom tests.tiny import near_bigram_pair\nfrom eagle.heads.checkpoint import save_head\n"
            "_, head = near_bigram_pair(2)\nprint('go', flush=True)\n"
            f"while True:\n    save_head({str(tmp_path / 'head')!r}, head, dtype=torch.float32)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True, env=clean_env())
    try:
        assert proc.stdout.readline().strip() == "go"
        time.sleep(random.Random(seed).uniform(0.05, 0.6))
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    visible = [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert visible in ([], ["head"])
    if visible:
        load_head(tmp_path / "head")  # whole


def test_a_utf16_jsonl_cut_at_an_odd_byte_is_one_line(tmp_path):
    path = tmp_path / "chats.jsonl"
    data = "\n".join(json.dumps(c, ensure_ascii=False) for c in CHATS).encode("utf-16")
    path.write_bytes(data[:-1])
    with pytest.raises(DataError, match=r"not utf-16 text") as e:
        read_conversations(str(path))
    assert str(path) in str(e.value) and "\n" not in str(e.value)
