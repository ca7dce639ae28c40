"""data_prep's shard I/O: a shard's bytes held once, hashed while written, written while the next
shard's forward runs, byte for byte what a serial writer writes.
"""

from __future__ import annotations

import builtins
import io
import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import safetensors
import torch
from safetensors.torch import save_file
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from data_prep import pipeline, store
from data_prep.store import Record, read_manifest, sha256_file, shard_name, write_shard
from data_prep.target_forward import compute_records
from tests.tiny import data_prep_config as config


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "chats.jsonl"
    path.write_text("\n".join(json.dumps({"conversations": [
        {"from": "human", "value": f"What is {i} times 7?"}, {"from": "gpt", "value": f"{7 * i}. " * (1 + i % 5)}]})
        for i in range(14)))
    return path


class LiveBytes(TorchDispatchMode):
    """Bytes of the CPU tensors' storages alive at once, over every op run inside the mode (peak)."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.now = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for key, (ref, n) in list(self.live.items()):
            if ref.expired():
                del self.live[key]
                self.now -= n
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                if storage.data_ptr() not in self.live and storage.nbytes():
                    self.live[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
                    self.now += storage.nbytes()
        self.peak = max(self.peak, self.now)
        return out


class OnesTarget(nn.Module):
    """A stand-in target whose decoder returns ones [B, S, H]: wide features, nothing else allocated."""

    def __init__(self, hidden: int):
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))
        self.hidden = hidden
        self.config = SimpleNamespace(get_text_config=lambda: SimpleNamespace(hidden_size=hidden))

    def get_decoder(self):
        return self

    def forward(self, input_ids, attention_mask=None, use_cache=False, output_hidden_states=False):
        return SimpleNamespace(last_hidden_state=torch.ones(*input_ids.shape, self.hidden), hidden_states=None)


def test_a_shard_is_held_once_between_the_forward_and_the_disk(tmp_path):
    """compute_records + write_shard of one shard: the tensors alive at once never exceed the shard's
    bytes by more than a batch (per-row copies, then their concatenation, would hold it twice)."""
    hidden = 512
    tokenized = [(list(range(3, 3 + n)), [1] * n) for n in [40, 25, 33, 18, 50, 12, 44, 29] * 6]
    tokens = sum(len(ids) for ids, _ in tokenized)
    shard_bytes = tokens * (hidden * 4 + 4 + 1)  # fp32 features, int32 ids, uint8 mask
    batch_bytes = 64 * hidden * 4
    with LiveBytes() as meter:
        shard = compute_records(OnesTarget(hidden), tokenized, [-1], 64, 0)
        entry = write_shard(tmp_path / shard_name(0), shard, hidden, torch.float32)
    assert entry["tokens"] == tokens
    assert meter.peak <= shard_bytes + 2 * batch_bytes, f"peak {meter.peak / shard_bytes:.2f} x the shard's bytes"


def records(n: int, hidden: int = 8, seed: int = 0, aux: int = 0) -> list[Record]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        s = 2 + (i * 7) % 11
        out.append(Record(torch.randint(0, 100, (s,), generator=g), torch.randint(0, 2, (s,), generator=g).bool(),
                          torch.randn(s, hidden, generator=g).bfloat16(),
                          torch.randn(s, aux, generator=g).bfloat16() if aux else None))
    return out


class Reads:
    """Records every open for reading (builtins/io.open, safetensors' safe_open) of a shard file."""

    def __init__(self, monkeypatch):
        self.paths: list[str] = []
        real_open, real_safe = builtins.open, safetensors.safe_open

        def opened(file, mode="r", *args, **kwargs):
            if "r" in mode and "+" not in mode and Path(str(file)).name.endswith(".safetensors"):
                self.paths.append(Path(str(file)).name)
            return real_open(file, mode, *args, **kwargs)

        def safe(file, *args, **kwargs):
            self.paths.append(Path(str(file)).name)
            return real_safe(file, *args, **kwargs)

        for owner, name, fake in ((builtins, "open", opened), (io, "open", opened), (safetensors, "safe_open", safe),
                                  (store, "safe_open", safe)):
            monkeypatch.setattr(owner, name, fake)


def test_the_hash_is_taken_while_writing_and_equals_a_reread(tmp_path, monkeypatch):
    reads = Reads(monkeypatch)
    entries = [write_shard(tmp_path / shard_name(k), recs, 8, torch.bfloat16, {"why": k})
               for k, recs in enumerate([records(9), [], records(5, aux=16, seed=1)])]
    assert reads.paths == []  # nothing read back
    monkeypatch.undo()
    for entry in entries:
        assert entry["sha256"] == sha256_file(tmp_path / entry["file"])
    assert [e["records"] for e in entries] == [9, 0, 5]
    assert entries[2]["loss_tokens"] == int(sum(r.loss_mask.sum() for r in records(5, aux=16, seed=1)))


@pytest.mark.parametrize("case", ["plain", "empty", "aux", "float32"])
def test_the_bytes_are_those_of_safetensors_save_file(tmp_path, case):
    """The store's format stays safetensors' own bytes: stores written before and after hash alike."""
    recs = {"plain": records(7), "empty": [], "aux": records(6, aux=24, seed=2), "float32": records(4, seed=3)}[case]
    dtype = torch.float32 if case == "float32" else torch.bfloat16
    write_shard(tmp_path / "ours.safetensors", recs, 8, dtype, {"why": 3, "long": 1})
    lengths = torch.tensor([len(r.input_ids) for r in recs], dtype=torch.int64)
    tensors = {
        "input_ids": torch.cat([r.input_ids for r in recs]).to(torch.int32) if recs else torch.zeros(0, dtype=torch.int32),
        "loss_mask": torch.cat([r.loss_mask for r in recs]).to(torch.uint8) if recs else torch.zeros(0, dtype=torch.uint8),
        "hidden_states": torch.cat([r.hidden_states for r in recs]).to(dtype) if recs else torch.zeros(0, 8, dtype=dtype),
        "offsets": torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]),
    }
    if case == "aux":
        tensors["aux_hidden_states"] = torch.cat([r.aux_hidden_states for r in recs]).to(dtype)
    save_file(tensors, str(tmp_path / "theirs.safetensors"),
              metadata={"skipped": json.dumps({"why": 3, "long": 1}, sort_keys=True)})
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "theirs.safetensors").read_bytes()


def test_prepare_never_reads_back_a_shard_it_wrote(tiny_dir, chats, tmp_path, monkeypatch):
    reads = Reads(monkeypatch)
    out = pipeline.prepare(config(tiny_dir, chats, tmp_path / "s"))
    monkeypatch.undo()
    assert reads.paths == []
    manifest = read_manifest(out)
    assert manifest["complete"] and all(s["sha256"] == sha256_file(out / s["file"]) for s in manifest["shards"])


def test_the_next_shards_forward_runs_while_a_shard_is_written(tiny_dir, chats, tmp_path, monkeypatch):
    """While shard k is being written, the forward of shard k+1 starts (the GPU does not wait for the disk)."""
    forwards = []
    started = threading.Condition()
    real_compute, real_write = pipeline.compute_records, pipeline.write_shard

    def compute(*args):
        with started:
            forwards.append(len(forwards))
            started.notify_all()
        return real_compute(*args)

    overlapped = {}

    def write(path, *args):
        k = int(path.name[6:11])
        with started:  # hold this write until the next shard's forward begins (or 2 s pass)
            overlapped[k] = started.wait_for(lambda: len(forwards) > k + 1, timeout=2.0)
        return real_write(path, *args)

    monkeypatch.setattr(pipeline, "compute_records", compute)
    monkeypatch.setattr(pipeline, "write_shard", write)
    pipeline.prepare(config(tiny_dir, chats, tmp_path / "s", **{"data.limit": 12}))  # shards of 4: three
    assert overlapped == {0: True, 1: True, 2: False}  # the last shard has no next forward


def test_a_store_written_in_the_background_equals_one_written_serially(tiny_dir, chats, tmp_path, monkeypatch):
    background = pipeline.prepare(config(tiny_dir, chats, tmp_path / "background"))
    monkeypatch.setattr(pipeline, "BACKGROUND_WRITES", False)
    serial = pipeline.prepare(config(tiny_dir, chats, tmp_path / "serial"))
    a, b = read_manifest(background), read_manifest(serial)
    assert [s["sha256"] for s in a["shards"]] == [s["sha256"] for s in b["shards"]]
    for s in a["shards"]:
        assert (background / s["file"]).read_bytes() == (serial / s["file"]).read_bytes()


def test_a_writer_error_names_the_shard_and_keeps_the_finished_ones(tiny_dir, chats, tmp_path, monkeypatch):
    """The writer thread fails on the third shard: the main thread raises with its name; the two
    finished shards stay in the manifest and on disk, and a rerun ends with an uninterrupted store."""
    whole = pipeline.prepare(config(tiny_dir, chats, tmp_path / "whole"))
    real_write = pipeline.write_shard

    def write(path, *args):
        if path.name == shard_name(2):
            raise OSError(5, "Input/output error")
        return real_write(path, *args)

    monkeypatch.setattr(pipeline, "write_shard", write)
    cfg = config(tiny_dir, chats, tmp_path / "cut")
    with pytest.raises(OSError, match=shard_name(2)):
        pipeline.prepare(cfg)
    partial = read_manifest(tmp_path / "cut")
    assert [s["file"] for s in partial["shards"]] == [shard_name(0), shard_name(1)]
    assert sorted(p.name for p in (tmp_path / "cut").glob("shard-*")) == [shard_name(0), shard_name(1)]
    monkeypatch.setattr(pipeline, "write_shard", real_write)
    pipeline.prepare(cfg)
    assert [s["sha256"] for s in read_manifest(tmp_path / "cut")["shards"]] == \
        [s["sha256"] for s in read_manifest(whole)["shards"]]
