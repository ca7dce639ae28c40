"""The run's DeepSpeed checkpoints: where to resume from, what a resumed run must match, pruning.

Every `train.save_every` steps (and at the end) a checkpoint goes to
output_dir/checkpoints/stepNNNNNNNN with the step in its client state; `train.resume=auto`
continues the newest one (DeepSpeed's `latest` file names it).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path


def step_tag(step: int) -> str:
    return f"step{step:08d}"


def resume_from(resume: str, ckpt_dir: Path) -> tuple[Path, str | None] | None:
    """(load dir, tag or None for `latest`) for train.resume = auto | none | a checkpoint directory."""
    if resume == "none":
        return None
    if resume == "auto":
        return (ckpt_dir, None) if (ckpt_dir / "latest").exists() else None
    path = Path(resume)
    return (path, None) if (path / "latest").exists() else (path.parent, path.name)


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
    latest_file = ckpt_dir / "latest"
    latest = latest_file.read_text().strip() if latest_file.exists() else None
    for p in tags[:-keep_last]:
        if p.name != latest:
            shutil.rmtree(p, ignore_errors=True)
