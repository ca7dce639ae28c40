"""The run's DeepSpeed checkpoints: saving them whole, where to resume from, what a resumed run
must match, pruning.

Every `train.save_every` steps (and at the end) `save_checkpoint` writes
output_dir/checkpoints/stepNNNNNNNN with the step in its client state. DeepSpeed writes the files
(every rank its ZeRO partition, the first rank the model states) without touching `latest`; once
every rank has returned from it (DeepSpeed ends the save with a barrier) and found its own files
whole, the rank that writes on this storage (rank 0; with one output_dir per node, each node's
local rank 0: train/output_layout.py) writes the completion marker TAG/.complete, then `latest`,
each through a temporary file and a rename. A rank that dies or fails inside the save stops the
others before `latest` moves: it keeps naming the checkpoint before.

`train.resume=auto` continues the newest checkpoint that every rank can load from its own storage
(train/checkpoint_files.py): normally the one `latest` names; if that one is incomplete (a save cut
by a kill on another rank, from a run that saved without the marker), the newest whole one before it.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

import torch.distributed as dist

from eagle.common import distributed
from train.checkpoint_files import MARKER, problem, write_marker, write_text_atomic

log = logging.getLogger("train")
LATEST = "latest"


def step_tag(step: int) -> str:
    return f"step{step:08d}"


def save_checkpoint(engine, ckpt_dir: Path, tag: str, client_state: dict, keep_last: int) -> Path:
    """DeepSpeed checkpoint `tag` on every rank; then the marker, `latest` and pruning by the writing
    rank of each storage. Collective: call on all ranks."""
    engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state=client_state, save_latest=False)
    rank = _rank()
    problems = {r: why for r, why in _gathered(problem(ckpt_dir / tag, rank, markers_in_use=False), f"the check of checkpoint {tag}") if why}
    if problems:
        r, why = next(iter(problems.items()))
        raise RuntimeError(f"{ckpt_dir / tag}: checkpoint not whole after saving: rank {r}: {why}; "
                           f"{ckpt_dir / LATEST} still names the checkpoint before")
    if writes_latest(engine):
        write_marker(ckpt_dir / tag)
        write_text_atomic(ckpt_dir / LATEST, tag)
        prune_checkpoints(ckpt_dir, keep_last)
    distributed.barrier(f"the end of saving checkpoint {tag}")
    return ckpt_dir / tag


def writes_latest(engine) -> bool:
    """Does this rank write `latest` and the marker? Rank 0, or with node-local storage each node's local rank 0."""
    if engine.use_node_local_storage():
        return int(getattr(engine, "local_rank", 0)) == 0
    return _rank() == 0


def resume_from(resume: str, ckpt_dir: Path) -> tuple[Path, str] | None:
    """(load dir, tag) for train.resume = auto | none | a checkpoints folder | a checkpoint folder.
    Collective: every rank calls it and all get the same answer."""
    if resume == "none":
        return None
    if resume == "auto":
        return newest_whole(ckpt_dir)
    path = Path(resume)
    if (path / LATEST).exists():
        found = newest_whole(path)
        if found is None:
            raise FileNotFoundError(f"{path}: no checkpoint in it is complete on every rank")
        return found
    problems = {r: why for r, why in _gathered(problem(path, _rank(), _markers_in_use(path.parent)), "the check of the checkpoint to resume") if why}
    if problems:
        r, why = next(iter(problems.items()))
        raise ValueError(f"{path}: cannot resume from this checkpoint: rank {r}: {why}")
    return path.parent, path.name


def newest_whole(ckpt_dir: Path) -> tuple[Path, str] | None:
    """(ckpt_dir, the newest tag every rank can load), or None when there is none to resume."""
    markers = _markers_in_use(ckpt_dir)
    views = _gathered({t: problem(ckpt_dir / t, _rank(), markers) for t in _tags(ckpt_dir)},
                      "the choice of the checkpoint to resume")  # (rank, {tag: why})
    whole = [{t for t, why in view.items() if why is None} for _, view in views]
    seen = sorted({t for _, view in views for t in view}, key=_order, reverse=True)
    chosen = next((t for t in seen if all(t in w for w in whole)), None)
    latest = _latest(ckpt_dir)
    if latest is not None and latest != chosen:
        why = next((f"rank {r}: {view.get(latest, 'no such folder')}" for r, view in views if latest not in
                    whole[r]), "")
        log.warning("%s names %s, which cannot be resumed (%s); %s", ckpt_dir / LATEST, latest, why,
                    f"resuming from {chosen}" if chosen else "no complete checkpoint: starting from step 0")
    if chosen is None and any(whole):
        r = next((r for r, w in enumerate(whole) if not w), 0)
        raise ValueError(f"{ckpt_dir}: no checkpoint there is whole on every rank (rank {r} has "
                         f"{len(whole[r])} whole ones, rank 0 {len(whole[0])}); give every node the same "
                         "checkpoints, or train.resume=none to start over")
    return None if chosen is None else (ckpt_dir, chosen)


def check_resumable(load_path: str, client: dict, world: int, store: str) -> None:
    """A resumed run must have the same number of ranks and read the same store."""
    if client.get("world_size", world) != world:
        raise ValueError(f"{load_path}: saved with {client['world_size']} ranks, resuming with {world}: "
                         "the data order would differ")
    saved_store = client.get("store")  # absent in checkpoints of older trainer versions
    if saved_store is not None and saved_store != store:
        raise ValueError(f"{load_path}: trained on store {saved_store}, but this run reads "
                         f"{store}: pick a new output_dir, or train.resume=none to start over")


def prune_checkpoints(ckpt_dir: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` stepNNNNNNNN dirs (never the one `latest` names)."""
    if keep_last <= 0:
        return
    tags = sorted(p for p in ckpt_dir.glob("step*") if p.is_dir() and re.fullmatch(r"step\d+", p.name))
    latest = _latest(ckpt_dir)
    for p in tags[:-keep_last]:
        if p.name != latest:
            shutil.rmtree(p, ignore_errors=True)


def _tags(ckpt_dir: Path) -> list[str]:
    """Checkpoint folders in ckpt_dir (step tags, and whatever `latest` names)."""
    tags = {p.name for p in ckpt_dir.glob("step*") if p.is_dir() and re.fullmatch(r"step\d+", p.name)}
    latest = _latest(ckpt_dir)
    return sorted(tags | ({latest} if latest else set()), key=_order, reverse=True)


def _order(tag: str) -> tuple[int, str]:
    return (1, tag) if re.fullmatch(r"step\d+", tag) else (0, tag)


def _latest(ckpt_dir: Path) -> str | None:
    path = ckpt_dir / LATEST
    return (path.read_text().strip() or None) if path.is_file() else None


def _markers_in_use(ckpt_dir: Path) -> bool:
    return any(ckpt_dir.glob(f"*/{MARKER}"))


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _gathered(value, what: str) -> list[tuple[int, object]]:
    """(rank, value) of every rank, in rank order (this rank's own in a group of one)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [(0, value)]
    return sorted(distributed.merged({dist.get_rank(): value}, what).items())
