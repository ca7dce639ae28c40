"""Trainer efficiency: tokens/s of the full training loop over a bare forward+backward.

    python -m experiments.train_throughput +model=smollm2_135m [throughput.steps=20 throughput.warmup=3 ...]

Runs the real Trainer (DeepSpeed engine, data loading, noise, loss, optimizer, metrics) for
warmup + steps optimizer steps into a temporary output_dir, then times a plain torch
forward + loss + backward of a fresh head (same dtype) on the very same micro-batches,
already collated in memory. Prints both rates and their ratio (goal: >= 0.85).

With train.features=online the bare loop runs the target's forward too (the trainer's own
`features.fill`, one inference-mode forward per micro-batch) before the head's forward and
backward: the ratio is then to "bare target forward + head forward/backward" (goal: >= 0.9).
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
import time

import hydra
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from data_prep.resolvers import register_resolvers
from eagle.heads.checkpoint import build_head
from train.data import collate
from train.loss import uniform_noise
from train.unroll import unrolled_forward


def bare_tokens_per_s(trainer, batches: list[list[int]]) -> float:
    """Pairs/s of forward + loss + backward of a plain head (no engine) over pre-collated batches
    (online: after the target's forward over each)."""
    t = trainer.cfg.train
    head = build_head(trainer.draft_config).to(trainer.device, trainer.dtype).train()
    collated = [collate([trainer.records[i] for i in b]) for b in batches]
    pairs = sum(b.num_pairs for b in collated)
    gen = torch.Generator(device=trainer.device).manual_seed(0)
    start = time.perf_counter()
    for batch in collated:
        p = trainer.pairs(batch)
        features = uniform_noise(p.features, t.noise, t.noise_ref_len, gen).to(trainer.dtype)
        preds = unrolled_forward(head, features, trainer.frozen.embed_tokens(p.next_ids), p.position_ids,
                                 t.ttt_steps, t.ttt_detach)
        outs = trainer.losses(preds, p, head=head)
        sum(t.ttt_decay ** i * o.loss for i, o in enumerate(outs)).backward()
    return pairs / (time.perf_counter() - start)


def measure(cfg: DictConfig, steps: int = 20, warmup: int = 3) -> dict[str, float]:
    """Run the trainer for warmup + steps and compare with the bare loop on the same batches."""
    from train.config import validate
    from train.run import ensure_store
    from train.trainer import Trainer

    cfg = validate(cfg)
    if cfg.train.features == "store":
        ensure_store(cfg)
    with tempfile.TemporaryDirectory(prefix="eagle-throughput-") as out:
        with open_dict(cfg):
            cfg.output_dir = out
            cfg.train.update(max_steps=warmup + steps, stop_after=None, save_every=0, eval_every=0, tau_every=0,
                             resume="none", eval_max_batches=1, log_every=10**9, progress=False)
            cfg.wandb.mode = "disabled"
        trainer = Trainer(cfg)
        trainer.fit()
        timed = trainer.step_times[warmup:]
        trainer_rate = sum(p for p, _ in timed) / sum(s for _, s in timed)
        bare_rate = bare_tokens_per_s(trainer, list(trainer.planned_batches(warmup, steps)))
    return {"trainer_tokens_per_s": trainer_rate, "bare_tokens_per_s": bare_rate, "ratio": trainer_rate / bare_rate,
            "steps": steps, "dtype": str(trainer.dtype), "world_size": trainer.world, "features": str(cfg.train.features)}


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    extra = OmegaConf.to_container(cfg.get("throughput") or {})
    with open_dict(cfg):
        cfg.pop("throughput", None)
    result = measure(cfg, steps=int(extra.get("steps", 20)), warmup=int(extra.get("warmup", 3)))
    print(json.dumps(result, indent=2), file=sys.stdout)


if __name__ == "__main__":
    register_resolvers()
    main()
