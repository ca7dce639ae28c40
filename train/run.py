"""One command, the whole job: make sure the feature store exists, train, export, push.

On several nodes: the store may be one shared folder or a copy per node (train/store_copies.py),
and output_dir one shared folder or one per node (train/output_layout.py); online training
(train.features=online) reads no store at all. docs/reliability.md has the contracts.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from omegaconf import DictConfig

from eagle.common.locks import exclusive
from data_prep.data_config import TargetFiles, prep_config, resolve
from data_prep.store import is_complete
from train.config import validate
from train.engine import init_distributed
from train.output_layout import output_layout, use_layout
from train.store_copies import agree_on_store

log = logging.getLogger("train")


def ensure_store(cfg: DictConfig, target: TargetFiles | None = None) -> Path:
    """Run data_prep into cfg.store_dir when it is missing or incomplete; `target`: the job's
    resolved target (data_prep resolves it when None).

    Every rank calls it: data_prep splits the shards over the ranks of a torchrun job itself.
    The ranks first compare what they see (train/store_copies.py): one complete store, shared or
    copied to each node, is read as it is; a store missing everywhere is built by data_prep, in a
    folder every rank must share; anything else stops every rank with one line.
    """
    store_dir = Path(cfg.store_dir)
    init_distributed()
    if agree_on_store(store_dir):
        return store_dir
    from data_prep.pipeline import prepare  # lazy: data_prep is only needed to build stores

    log.info("feature store %s is missing or incomplete: running data_prep", store_dir)
    prepare(cfg, target)
    if not is_complete(store_dir):
        raise RuntimeError(f"data_prep finished but {store_dir} is still incomplete")
    return store_dir


def run(cfg: DictConfig):
    """Train a head as configured; returns train.trainer.FitResult."""
    from train.trainer import Trainer

    cfg = validate(cfg)
    target = resolve(prep_config(cfg).model)  # once for the job: data_prep, the features, the head, τ
    if cfg.train.features == "store":  # online reads the conversations itself (train/feature_source.py)
        ensure_store(cfg, target)
    init_distributed()
    layout = output_layout(cfg.output_dir)  # one folder for all ranks, or one per node (train/output_layout.py)
    use_layout(cfg, layout)
    with exclusive(cfg.output_dir, "training run", take=layout.writer):  # rank 0, or each node's first rank
        trainer = Trainer(cfg, target)
        result = trainer.fit()
    if trainer.rank == 0:
        _report(result)
        if cfg.hub.push and not result.stopped:
            from train.publish import publish

            url = publish(result.head_dir, cfg.hub.repo_id, private=cfg.hub.private, endpoint=cfg.hub.endpoint,
                          fmt=cfg.hub.format)
            print(f"pushed {result.head_dir} to {url}", file=sys.stderr)
    return result


def _report(result) -> None:
    if result.stopped:
        print(f"stopped at step {result.step} (train.stop_after); resume with train.resume=auto", file=sys.stderr)
        return
    metrics = ", ".join(f"{k}={v:.4f}" for k, v in result.eval_metrics.items())
    print(f"done: {result.step} steps; eval {metrics or '(no held-out data)'}; head in {result.head_dir}",
          file=sys.stderr)
