"""What a run reports: Weights & Biases on rank 0, and the code version it records."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from omegaconf import DictConfig, OmegaConf


class Tracker:
    """A W&B run on rank 0, or nothing (other ranks, `wandb.mode=disabled`): `log` is then a no-op."""

    def __init__(self, run=None):
        self.run = run

    @classmethod
    def start(cls, cfg: DictConfig, output_dir: Path, rank: int, world: int, run_id: str | None) -> "Tracker":
        """Start (or, with `run_id`, resume) the run; files go under output_dir.
        wandb.mode null = online when WANDB_API_KEY is set, else offline."""
        w = cfg.wandb
        mode = w.mode or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        if rank != 0 or mode == "disabled":
            return cls()
        import wandb

        output_dir.mkdir(parents=True, exist_ok=True)
        config = OmegaConf.to_container(cfg, resolve=True)
        config["code_version"] = code_version()
        config["world_size"] = world
        return cls(wandb.init(project=w.project, entity=w.entity, name=w.name, tags=list(w.tags), mode=mode,
                              dir=str(output_dir), config=config, id=run_id, resume="allow" if run_id else None))

    @property
    def id(self) -> str | None:
        return None if self.run is None else self.run.id

    def log(self, metrics: dict, step: int) -> None:
        if self.run is not None and metrics:
            self.run.log(metrics, step=step)

    def finish(self, summary: dict[str, float] | None = None) -> None:
        if self.run is None:
            return
        for k, v in (summary or {}).items():
            self.run.summary[k] = v
        self.run.finish()


def code_version() -> str:
    """git commit of the code (with '-dirty' when the tree has changes), or 'unknown'."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("-dirty" if dirty else "")
