"""Take finished shards from other stores instead of recomputing them (`data.reuse=[DIR, ...]`).

A shard's features depend only on its records' tokens and on how the target ran: which
model, dtype, stored layers, max_len, chat template and batch budget. When a new store's
sources begin with the conversations of an older store (the same regenerated chats, then
new files), its first shards hold the very same records, and recomputing them is a full
target forward for nothing. Before computing shard k the pipeline asks `Donors.reuse` for
a donor shard with the same token ids and skip counts. When its loss masks are the same too,
the file is hard-linked (or copied) into the new store, and its entry in the donor's manifest
(hash included) becomes the new shard's: the linked bytes are not hashed again. When only the
masks differ (a store of the same chats with `data.mask_repeats`), the donor's features are
written again with the new masks: a copy, not a forward.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections import Counter
from pathlib import Path

from typing import NamedTuple

import torch
from safetensors import safe_open

from data_prep.store import read_manifest, shard_entry, tmp_path, write_shard_tensors

log = logging.getLogger("data_prep")

# What must agree between a donor store and the store being built, besides the records.
SAME_TARGET = ("resolved_path", "dtype", "feature_layers", "max_len", "hidden_size")


class Fingerprint(NamedTuple):
    """Hashes of a shard's records: of their tokens and skip counts, and of their loss masks."""

    tokens: str
    mask: str

    @classmethod
    def of(cls, ids: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor, skipped: dict) -> Fingerprint:
        """ids [N] int32, mask [N] uint8, lengths [R] int64 (tokens per record), skip counts."""
        h = hashlib.sha256()
        for t in (lengths.to(torch.int64), ids.to(torch.int32)):
            h.update(t.contiguous().numpy().tobytes())
        h.update(json.dumps(dict(sorted(skipped.items()))).encode())
        return cls(h.hexdigest(), hashlib.sha256(mask.to(torch.uint8).contiguous().numpy().tobytes()).hexdigest())


def _flat(tokenized: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids [N] int32, mask [N] uint8 and lengths [R] int64 of tokenized records."""
    ids = torch.tensor([i for t, _ in tokenized for i in t], dtype=torch.int32)
    mask = torch.tensor([m for _, ms in tokenized for m in ms], dtype=torch.uint8)
    lengths = torch.tensor([len(t) for t, _ in tokenized], dtype=torch.int64)
    return ids, mask, lengths


def file_fingerprint(path: Path) -> Fingerprint:
    with safe_open(str(path), framework="pt") as f:
        offsets = f.get_tensor("offsets")
        skipped = json.loads((f.metadata() or {}).get("skipped", "{}"))
        return Fingerprint.of(f.get_tensor("input_ids"), f.get_tensor("loss_mask"), offsets[1:] - offsets[:-1], skipped)


_ENTRY_KEYS = {"file", "skipped", "records", "tokens", "loss_tokens", "sha256"}  # a whole manifest entry


class Donor(NamedTuple):
    """A finished shard of another store, its entry in that store's manifest and its fingerprint."""

    path: Path
    entry: dict
    fingerprint: Fingerprint


class Donors:
    """Shards of other complete stores, by fingerprint, that may stand in for new ones."""

    def __init__(self, dirs, target: dict, template_sha: str, batch_tokens: int):
        self.shards: dict[str, Donor] = {}  # by the hash of their tokens; the first store listed wins
        for d in map(Path, dirs):
            if self._usable(d, target, template_sha, batch_tokens):
                for entry in read_manifest(d)["shards"]:
                    fp = file_fingerprint(d / entry["file"])
                    self.shards.setdefault(fp.tokens, Donor(d / entry["file"], entry, fp))

    @staticmethod
    def _usable(d: Path, target: dict, template_sha: str, batch_tokens: int) -> bool:
        m = read_manifest(d)
        if m is None or not m.get("complete"):  # a speed-up only: computing instead is never wrong
            log.warning("data.reuse: not reusing %s: it is not a complete feature store", d)
            return False
        theirs = m["target"]
        differ = [k for k in SAME_TARGET if theirs.get(k) != target.get(k)]
        if m.get("chat_template_sha256") != template_sha:
            differ.append("chat template")
        if theirs.get("batch_tokens", batch_tokens) != batch_tokens:
            differ.append("batch_tokens")
        if differ:
            log.warning("data.reuse: not reusing %s: it differs from this store in %s", d, ", ".join(differ))
            return False
        if "batch_tokens" not in theirs:
            log.info("data.reuse: %s does not record its batch budget; taken to be data.batch_tokens=%d", d, batch_tokens)
        return True

    def reuse(self, tokenized: list[tuple[list[int], list[int]]], skipped: Counter, dst: Path) -> dict | None:
        """Put a donor's shard of the same token ids and skip counts at `dst` (linked when its loss masks
        are the same too, else written with those of `tokenized`); return the new shard's manifest entry,
        or None when no donor holds these records."""
        if not self.shards:
            return None
        ids, mask, lengths = _flat(tokenized)
        fp = Fingerprint.of(ids, mask, lengths, dict(skipped))
        donor = self.shards.get(fp.tokens)
        if donor is None:
            return None
        return link_shard(donor, dst) if fp.mask == donor.fingerprint.mask else remask_shard(donor, dst, mask)


def remask_shard(donor: Donor, dst: Path, mask: torch.Tensor) -> dict:
    """Write the donor's shard at `dst` with `mask` [N] uint8 as its loss_mask, atomically."""
    with safe_open(str(donor.path), framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
        skipped = json.loads((f.metadata() or {}).get("skipped", "{}"))
    if mask.shape != tensors["loss_mask"].shape:
        raise ValueError(f"{donor.path}: {tensors['loss_mask'].numel()} tokens, but the new masks cover {mask.numel()}")
    tensors["loss_mask"] = mask.to(tensors["loss_mask"].dtype)
    return write_shard_tensors(dst, tensors, skipped)


def link_shard(donor: Donor, dst: Path) -> dict:
    """Put the donor's shard at `dst` atomically (a hard link when the filesystem allows, else a
    copy); return its manifest entry under the new name (read from the file when the donor's
    manifest lacks a field)."""
    tmp = tmp_path(dst)
    try:
        try:
            os.link(donor.path, tmp)
        except OSError:
            shutil.copyfile(donor.path, tmp)
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if _ENTRY_KEYS <= donor.entry.keys():
        return {**donor.entry, "file": dst.name}
    return shard_entry(dst)

