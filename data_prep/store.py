"""The feature store: sharded safetensors plus `manifest.json` (format in docs/design.md).

Writer side (`write_shard`, `write_manifest`) is used by data_prep; reader side
(`FeatureStore`) by train. One shard holds many records as flat tensors:

    input_ids          [T]        int32
    loss_mask          [T]        uint8   (1 = assistant token the head learns)
    hidden_states      [T, H]     bf16    (target feature, post-norm last layer)
    aux_hidden_states  [T, K*H]   bf16    (only when extra layers are captured, EAGLE-3)
    offsets            [N+1]      int64   (record i is rows offsets[i]:offsets[i+1])

Shards are written to a temporary name (`NAME.tmp-PID`) and renamed when whole, so a file named
`shard-NNNNN.safetensors` is always complete; the next run removes what a killed writer left
(data_prep/stale_files.py).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from data_prep.shard_buffer import ShardBuffer
from data_prep.shard_file import write_safetensors

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TMP = ".tmp-"  # NAME.tmp-PID: a file being written by process PID (data_prep/stale_files.py)


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


@dataclass
class Record:
    """One tokenized conversation and its target features (None: online training computes them)."""

    input_ids: torch.Tensor  # [S] int
    loss_mask: torch.Tensor  # [S] bool/uint8
    hidden_states: torch.Tensor | None  # [S, H]
    aux_hidden_states: torch.Tensor | None = None  # [S, K*H]


def write_shard(
    path: Path,
    shard: ShardBuffer | list[Record],
    hidden_size: int,
    dtype: torch.dtype = torch.bfloat16,
    skipped: dict[str, int] | None = None,
) -> dict:
    """Write one shard (a filled ShardBuffer, or records) atomically; return its manifest entry.

    The entry comes from the tensors in memory and the hash of the bytes as they were written:
    the file is not read back. `skipped` (reason -> count) travels in the file's metadata, so the
    manifest can be rebuilt from finished shards alone after an interruption. A shard whose
    conversations were all skipped is written empty (it still marks its slice of the input as done).
    """
    if not isinstance(shard, ShardBuffer):
        shard = ShardBuffer.of_records(shard, dtype)
    shard.wait()  # features copied from a GPU have landed
    return write_shard_tensors(path, shard.tensors(hidden_size, dtype), skipped)


def write_shard_tensors(path: Path, tensors: dict[str, torch.Tensor], skipped: dict[str, int] | None = None) -> dict:
    """Write a shard's tensors (the store's names, contiguous, on the CPU) atomically, after checking
    the disk has room; return its manifest entry, from the tensors and the hash of the bytes written."""
    skipped_json = json.dumps(skipped or {}, sort_keys=True)
    tmp = tmp_path(path)
    need = sum(t.numel() * t.element_size() for t in tensors.values())
    _check_space(path, need)
    try:
        digest = write_safetensors(tmp, tensors, metadata={"skipped": skipped_json})
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            raise OutOfSpace(_space_message(path, need)) from None
        raise
    os.replace(tmp, path)
    offsets = tensors["offsets"]  # [N+1]
    return {
        "file": path.name,
        "skipped": json.loads(skipped_json),
        "records": len(offsets) - 1,
        "tokens": int(offsets[-1]),
        "loss_tokens": int(tensors["loss_mask"].sum()),
        "sha256": digest,
    }


def tmp_path(path: Path) -> Path:
    """Where this process writes `path` before renaming it: NAME.tmp-PID beside it."""
    return path.with_name(f"{path.name}{TMP}{os.getpid()}")


class OutOfSpace(OSError):
    """The disk of the store cannot hold the next shard (finished shards stay valid)."""


def _check_space(path: Path, need: int) -> None:
    if shutil.disk_usage(path.parent).free < need + (64 << 20):  # keep 64 MB of slack
        raise OutOfSpace(_space_message(path, need))


def _space_message(path: Path, need: int) -> str:
    free = shutil.disk_usage(path.parent).free
    return (f"{path.parent}: no space for {path.name} ({need / 2**20:.0f} MB needed, {free / 2**20:.0f} MB free). "
            f"Free some space or point EAGLE_CACHE (or store_dir=...) at a bigger disk, then rerun: "
            f"the finished shards are kept and the run resumes after them")


def shard_entry(path: Path) -> dict:
    """Manifest entry of a finished shard, read back from the file itself."""
    with safe_open(str(path), framework="pt") as f:
        offsets = f.get_tensor("offsets")
        n_loss = int(f.get_tensor("loss_mask").sum())
        skipped = json.loads((f.metadata() or {}).get("skipped", "{}"))
    return {
        "file": path.name,
        "skipped": skipped,
        "records": len(offsets) - 1,
        "tokens": int(offsets[-1]),
        "loss_tokens": n_loss,
        "sha256": sha256_file(path),
    }


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_json_atomic(path: Path, obj) -> None:
    tmp = tmp_path(path)
    try:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_manifest(directory: str | Path) -> dict | None:
    path = Path(directory) / MANIFEST
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: manifest is not valid JSON ({e})") from None


def is_complete(directory: str | Path) -> bool:
    manifest = read_manifest(directory)
    return bool(manifest and manifest.get("complete"))


class FeatureStore:
    """Read-only, memory-mapped view of a complete store: `store[i]` is one record.

    Nothing is loaded eagerly but the per-shard offsets; tensors are sliced from the
    memory-mapped safetensors files on access.
    """

    def __init__(self, directory: str | Path, require_complete: bool = True):
        self.dir = Path(directory)
        manifest = read_manifest(self.dir)
        if manifest is None:
            raise FileNotFoundError(f"{self.dir}: no {MANIFEST}; run data_prep first")
        if require_complete and not manifest.get("complete"):
            raise ValueError(f"{self.dir / MANIFEST}: store is incomplete; rerun data_prep to finish it")
        if manifest.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{self.dir / MANIFEST}: format_version {manifest.get('format_version')} != {FORMAT_VERSION}")
        self.manifest = manifest
        self._files = [self.dir / s["file"] for s in manifest["shards"]]
        self._handles: dict[int, object] = {}
        self._index: list[tuple[int, int, int]] = []  # (shard, start, end) per record
        for k, path in enumerate(self._files):
            with safe_open(str(path), framework="pt") as f:
                offsets = f.get_tensor("offsets").tolist()
            self._index += [(k, offsets[i], offsets[i + 1]) for i in range(len(offsets) - 1)]

    def __len__(self) -> int:
        return len(self._index)

    @property
    def hidden_size(self) -> int:
        return int(self.manifest["target"]["hidden_size"])

    def length(self, i: int) -> int:
        _, start, end = self._index[i]
        return end - start

    def lengths(self) -> list[int]:
        return [end - start for _, start, end in self._index]

    def _handle(self, shard: int):
        if shard not in self._handles:
            self._handles[shard] = safe_open(str(self._files[shard]), framework="pt")
        return self._handles[shard]

    def tokens(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids [T] long and loss_mask [T] bool of record i, without reading its features."""
        shard, start, end = self._index[i]
        f = self._handle(shard)
        return f.get_slice("input_ids")[start:end].long(), f.get_slice("loss_mask")[start:end].bool()

    def __getitem__(self, i: int) -> Record:
        shard, start, end = self._index[i]
        f = self._handle(shard)
        aux = f.get_slice("aux_hidden_states")[start:end] if "aux_hidden_states" in f.keys() else None
        input_ids, loss_mask = self.tokens(i)
        return Record(input_ids, loss_mask, f.get_slice("hidden_states")[start:end], aux)

    def __getstate__(self):  # handles are per process (DataLoader workers)
        state = dict(self.__dict__)
        state["_handles"] = {}
        return state


def new_manifest(
    target: dict,
    source: dict,
    shards: list[dict],
    complete: bool,
    chat_template_sha256: str,
) -> dict:
    """The manifest, in one place.

    target: {"name", "path", "hidden_size", "vocab_size", "num_layers", "dtype", "feature_layers"}
    source: {"data", "read", "kept", "skipped": {reason: count}, ...}
    shards: entries from `write_shard` / `shard_entry`, in shard order.
    """
    return {
        "format_version": FORMAT_VERSION,
        "target": target,
        "chat_template_sha256": chat_template_sha256,
        "source": source,
        "shards": shards,
        "records": sum(s["records"] for s in shards),
        "tokens": sum(s["tokens"] for s in shards),
        "loss_tokens": sum(s.get("loss_tokens", 0) for s in shards),
        "complete": complete,
    }


def write_manifest(directory: str | Path, manifest: dict) -> None:
    write_json_atomic(Path(directory) / MANIFEST, manifest)
