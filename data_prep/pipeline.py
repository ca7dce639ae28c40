"""data_prep as a function: conversations → (regenerated replies) → tokens + mask → features → store.

`prepare(cfg)` is what `python -m data_prep` runs and what `python -m train` calls when its
store is missing; it turns the Hydra config into a PrepConfig (data_prep/data_config.py) once,
and resolves the target once unless the caller passes the job's resolved target. It resumes:
the input is cut into fixed slices of `data.shard_records` conversations, slice k becomes
`shard-k`, and a shard that already exists is kept. With several processes (torchrun), rank r
computes shards k ≡ r (mod world) and rank 0 writes the manifest once all are done.

Per rank, the target's forward of shard k+1 runs while shard k goes to disk on a writer thread
(data_prep/shard_writer.py); a shard is held once in host memory (data_prep/shard_buffer.py), so
at most two are: the one being written and the one being filled. Each shard is hashed as it is
written (data_prep/shard_file.py), never read back. At its start a rank removes the temporary
files a killed writer left for its shards (data_prep/stale_files.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from eagle.common import distributed
from data_prep.conversations import Conversation, DataError, expand_sources, read_conversations
from data_prep.data_config import PrepConfig, TargetFiles, prep_config, resolve
from data_prep.target_forward import compute_records
from eagle.common.locks import exclusive
from eagle.common.precision import fast_dtype
from data_prep.plan import check_fits, store_plan
from data_prep.reuse import Donors
from data_prep.shard_writer import ShardWriter
from data_prep.stale_files import remove_stale
from data_prep.store import (
    MANIFEST,
    new_manifest,
    read_manifest,
    shard_entry,
    shard_name,
    write_manifest,
    write_shard,
)
from data_prep.template import template_hash, tokenize_chunk
from eagle.targets.resolve import load_target, local_device

log = logging.getLogger("data_prep")

BACKGROUND_WRITES = True  # write shard k on a thread while shard k+1's forward runs (data_prep/shard_writer.py)


@dataclass
class Job:
    """What one prepare() run works with, resolved from the config."""

    out: Path
    target_dir: Path
    tokenizer: object
    conversations: list[Conversation]
    source: dict
    target: dict  # the manifest's "target" entry
    rank: int
    world: int
    entries: dict[int, dict] = field(default_factory=dict)  # manifest entry of each finished shard


def prepare(cfg, target: TargetFiles | None = None) -> Path:
    """Build (or finish) the feature store at `store_dir` of `cfg` (a composed Hydra config or a
    PrepConfig); return its path. `target`: the job's resolved target, when the caller has it.
    One job at a time writes a store (eagle/common/locks.py)."""
    prep = prep_config(cfg)
    rank, world = distributed.init()
    with writing_store(prep.store_dir, rank):
        return _prepare(prep, target, rank, world)


@contextmanager
def writing_store(out: Path, rank: int) -> Iterator[None]:
    """Hold the store folder `out` for this job: every rank first sees the same folder (before any
    acts on what it finds there), then rank 0 takes its lock (one job at a time writes a store)."""
    out.mkdir(parents=True, exist_ok=True)
    distributed.check_shared(out, "store_dir")
    with exclusive(out, "data_prep store", take=rank == 0):
        yield


def _prepare(prep: PrepConfig, target: TargetFiles | None, rank: int, world: int) -> Path:
    out = prep.store_dir
    manifest = read_manifest(out)
    key = config_key(prep)
    if manifest is not None and manifest.get("config_key") != key:
        raise ValueError(
            f"{out / 'manifest.json'}: this directory holds a store built with other settings "
            f"(target/data/max_len/template); choose another store_dir or delete it"
        )
    if manifest is not None and manifest.get("complete"):
        log.info("store %s is complete (%d records); nothing to do", out, manifest["records"])
        return out
    job = open_job(prep, target or resolve(prep.model), rank, world)
    n_shards = -(-len(job.conversations) // prep.data.shard_records)
    mine = [k for k in range(n_shards) if k % world == rank]
    remove_stale(out, {shard_name(k) for k in mine} | ({MANIFEST} if rank == 0 else set()))  # before the disk check
    plan = store_plan(prep, job.target_dir, job.tokenizer, job.conversations)  # before any target forward
    log.info("plan: %s", "; ".join(plan.lines()))
    check_fits(plan, written=sum(p.stat().st_size for p in out.glob("shard-*.safetensors")))
    job.entries = _finished(out, manifest, mine)
    if rank == 0:
        write_manifest(out, _manifest(job, key, n_shards, complete=False))
    model = load_target(job.target_dir, fast_dtype(prep.model.dtype, local_device()))  # features stored in model.dtype
    stats = _run_shards(prep, job, model, n_shards, key)
    job.entries = distributed.merged(job.entries)  # every rank's shards, each hashed once, by its writer
    if rank == 0:
        manifest = _manifest(job, key, n_shards, complete=True)
        manifest["throughput"] = stats
        write_manifest(out, manifest)
        log.info("store %s complete: %d records, %d tokens", out, manifest["records"], manifest["tokens"])
    distributed.barrier()
    return out


def config_key(prep: PrepConfig) -> str:
    """Hash of every setting that changes the store's bytes (a glob's files, not the pattern)."""
    m, d = prep.model, prep.data
    files = expand_sources(d.source)
    parts = {
        "target": m.path, "dtype": m.dtype, "max_len": m.max_len, "chat_template": str(m.chat_template),
        "layers": list(m.feature_layers), "source": files[0] if files == [str(d.source)] else files,
        "limit": d.limit, "split": d.split, "shard_records": d.shard_records, "regenerate": d.regenerate,
        "regen": d.regen.reply_settings() if d.regenerate else None,
    }
    if d.offset:  # only when set, so the keys of stores read from record 0 stay as they were
        parts["offset"] = d.offset
    if d.mask_repeats is not None:  # likewise
        parts["mask_repeats"] = d.mask_repeats
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def open_job(prep: PrepConfig, target: TargetFiles, rank: int, world: int) -> Job:
    """The conversations a store of `prep` is made of (read, and regenerated into
    store_dir/regenerated when data.regenerate is set), the tokenizer and the manifest's target
    entry of the resolved `target`; no feature is computed."""
    out, d = prep.store_dir, prep.data
    tokenizer = target.tokenizer
    conversations, report = read_conversations(d.source, d.limit, d.split, d.offset)
    source = report.as_dict()
    if not conversations:
        raise_nothing_kept(report)
    if report.truncated:
        log.warning("%s is truncated: recovered %d whole records, dropped the last %d bytes (one partial record)",
                    report.source, report.read, report.truncated_bytes)
    if d.regenerate:
        from data_prep.regenerate import regenerate

        before = len(conversations)
        conversations = regenerate(prep, target.folder, tokenizer, conversations, out / "regenerated", rank, world)
        source["regenerated"] = True
        if before > len(conversations):
            source["skipped"]["first prompt too long to regenerate"] = before - len(conversations)
        if not conversations:
            report.skipped["first prompt too long to regenerate"] += before
            raise_nothing_kept(report)
    return Job(out, target.folder, tokenizer, conversations, source, _target_info(prep, target.folder), rank, world)


def raise_nothing_kept(report) -> None:
    """A store of zero records is refused before anything is written, with what was read and why it was skipped."""
    skipped = ", ".join(f"{n} {reason}" for reason, n in report.skipped.most_common()) or "none"
    raise DataError(report.source, None, "", f"no usable conversation: read {report.read}, kept 0; skipped by "
                    f"reason: {skipped}. A conversation needs a user turn and a non-empty assistant reply")


def _target_info(prep: PrepConfig, target_dir: Path) -> dict:
    from transformers import AutoConfig

    m = prep.model
    text = AutoConfig.from_pretrained(str(target_dir)).get_text_config()
    return {
        "name": m.name, "path": m.path, "resolved_path": str(target_dir),
        "hidden_size": text.hidden_size, "vocab_size": text.vocab_size, "num_layers": text.num_hidden_layers,
        "dtype": m.dtype, "feature_layers": list(m.feature_layers), "max_len": m.max_len,
        "batch_tokens": prep.data.batch_tokens,  # batches shape the bf16 features' last bits (data_prep.reuse)
    }


def _run_shards(prep: PrepConfig, job: Job, model, n_shards: int, key: str) -> dict:
    """Compute and write this rank's missing shards; shard k is written while shard k+1's forward runs."""
    mine = [k for k in range(n_shards) if k % job.world == job.rank]
    todo = [k for k in mine if not (job.out / shard_name(k)).exists()]
    if len(todo) < len(mine):
        log.info("resuming: %d of %d shards already written, kept as they are", len(mine) - len(todo), len(mine))
    hidden = model.config.get_text_config().hidden_size
    pad_id = job.tokenizer.pad_token_id if job.tokenizer.pad_token_id is not None else 0
    m, d = prep.model, prep.data
    dtype = getattr(torch, m.dtype)
    R = d.shard_records
    donors = Donors(d.reuse, job.target, template_hash(job.tokenizer), d.batch_tokens)
    reused = 0
    bar = tqdm(total=sum(len(job.conversations[k * R:(k + 1) * R]) for k in todo), unit="conv",
               desc=f"features{f' rank {job.rank}' if job.world > 1 else ''}", dynamic_ncols=True)
    tokens, start = 0, time.perf_counter()

    def progress(n_tokens: int, n_rows: int) -> None:
        nonlocal tokens
        tokens += n_tokens
        bar.update(n_rows)
        bar.set_postfix(tok_s=f"{tokens / (time.perf_counter() - start):.0f}")

    def written(k: int, entry: dict) -> None:  # in this thread, once shard k is on disk
        job.entries[k] = entry
        if job.world == 1:
            write_manifest(job.out, _manifest(job, key, n_shards, complete=False))

    with ShardWriter(written, background=BACKGROUND_WRITES) as writer:
        for k in todo:
            chunk = job.conversations[k * R:(k + 1) * R]
            tokenized, skipped = tokenize_chunk(job.tokenizer, chunk, m.max_len, d.mask_repeats)
            entry = donors.reuse(tokenized, skipped, job.out / shard_name(k))
            if entry is not None:
                written(k, entry)
                reused += 1
                bar.update(len(chunk))
                continue
            shard = compute_records(model, tokenized, list(m.feature_layers), d.batch_tokens, pad_id, progress, dtype)
            writer.submit(k, job.out / shard_name(k), write_shard, shard, hidden, dtype, dict(skipped))
            del shard  # the writer holds it until it is on disk
            bar.update(len(chunk) - len(tokenized))  # the skipped ones
    bar.close()
    if donors.shards:
        log.info("reused %d of %d shards from data.reuse", reused, len(todo))
    seconds = time.perf_counter() - start
    return {"tokens": tokens, "reused_shards": reused, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1) if seconds else None}


def _finished(out: Path, manifest: dict | None, shards: list[int]) -> dict[int, dict]:
    """Manifest entries of the finished shards among `shards`: the entry an earlier run recorded
    when it lists the file, else read (and hashed) from the file now. A shard whose file no longer
    parses (cut or overwritten since) is deleted, to be written again; a full re-hash of every
    shard is `python -m data_prep.check_store`."""
    recorded = {e["file"]: e for e in (manifest or {}).get("shards", [])}
    done = [k for k in shards if (out / shard_name(k)).exists() and _whole(out / shard_name(k))]
    return {k: recorded.get(shard_name(k)) or shard_entry(out / shard_name(k)) for k in done}


def _whole(path: Path) -> bool:
    """Does the shard parse as safetensors, with its data covering the file exactly? If not, delete it."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            f.get_slice("offsets")
        return True
    except Exception as e:  # SafetensorError: header cut, sizes that do not cover the file, bad JSON
        log.warning("%s is damaged (%s): writing it again", path, str(e).splitlines()[0] if str(e) else type(e).__name__)
        path.unlink()
        return False


def _manifest(job: Job, key: str, n_shards: int, complete: bool) -> dict:
    """The manifest over the finished shards the job knows of (job.entries); nothing is re-read."""
    shards = [job.entries[k] for k in sorted(job.entries)]
    source = dict(job.source)
    skipped = Counter(source.get("skipped", {}))
    for s in shards:
        skipped.update(s["skipped"])
    source["skipped"] = dict(sorted(skipped.items()))
    source["kept"] = sum(s["records"] for s in shards)
    manifest = new_manifest(job.target, source, shards, complete, template_hash(job.tokenizer))
    manifest["config_key"] = key
    manifest["expected_shards"] = n_shards
    return manifest
