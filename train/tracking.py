"""What a run reports: Weights & Biases and `metrics.jsonl` on rank 0, and the code version it records.

`output_dir/metrics.jsonl` holds one line per logged step ({"step": N, "train/feature_loss": ...}),
whatever the W&B mode: the loss curve without a W&B account. A resumed run appends to it, so the
steps between its last checkpoint and a kill appear twice; the later line is the one that counts.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

METRICS = "metrics.jsonl"


class Tracker:
    """A W&B run (rank 0, unless `wandb.mode=disabled`) and the metrics file (rank 0); other ranks log nothing."""

    def __init__(self, run=None, metrics_file: Path | None = None):
        self.run = run
        self.metrics_file = metrics_file

    @classmethod
    def start(cls, cfg: DictConfig, output_dir: Path, rank: int, world: int, run_id: str | None) -> "Tracker":
        """Start (or, with `run_id`, resume) the run; files go under output_dir.
        wandb.mode null = online when WANDB_API_KEY is set, else offline."""
        w = cfg.wandb
        mode = w.mode or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        if rank != 0:
            return cls()
        output_dir.mkdir(parents=True, exist_ok=True)
        metrics_file = output_dir / METRICS
        if mode == "disabled":
            return cls(None, metrics_file)
        import wandb

        config = OmegaConf.to_container(cfg, resolve=True)
        config["code_version"] = code_version()
        config["world_size"] = world
        return cls(wandb.init(project=w.project, entity=w.entity, name=w.name, tags=list(w.tags), mode=mode,
                              dir=str(output_dir), config=config, id=run_id, resume="allow" if run_id else None),
                   metrics_file)

    @property
    def id(self) -> str | None:
        return None if self.run is None else self.run.id

    def log(self, metrics: dict, step: int) -> None:
        if not metrics:
            return
        if self.run is not None:
            self.run.log(metrics, step=step)
        if self.metrics_file is not None:
            with open(self.metrics_file, "a") as f:
                f.write(json.dumps({"step": step, **{k: float(v) for k, v in metrics.items()}}) + "\n")

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


def read_metrics(output_dir: str | Path) -> dict[int, dict[str, float]]:
    """metrics.jsonl of a run as {step: metrics}; a step logged twice (before a kill and after the
    resume) keeps its later line, merged over the earlier one's keys."""
    out: dict[int, dict[str, float]] = {}
    path = Path(output_dir) / METRICS
    for line in path.read_text().splitlines() if path.exists() else []:
        row = json.loads(line)
        step = int(row.pop("step"))
        out[step] = {**out.get(step, {}), **row}
    return out
