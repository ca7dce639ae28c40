"""DeepSpeed setup: process group, DeepSpeed config, optimizer (train/optimizers.py), LR schedule, full weights.

Always `deepspeed.initialize`, also for one process without a launcher: `init_distributed`
joins the program's one process group (eagle/common/distributed.py), a group of one without a
launcher.
"""

from __future__ import annotations

import logging
import math
import os
import sys

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf
from torch import nn

from eagle.common import distributed
from eagle.common.precision import fast_dtype
from train.optimizers import build_optimizer

NEVER = 10**12  # DeepSpeed's own step printing: off (we log ourselves)

log = logging.getLogger("train")


def extensions_dir() -> str:
    """Where DeepSpeed builds its CPU ops: inside the active environment, not a user-wide cache.

    DeepSpeed compiles a shared-memory comm op on first use, guarded by a plain lock file; a
    run killed mid-build leaves the lock and every later start waits on it forever. A
    per-environment directory, built once by scripts/setup.sh, keeps runs off that path.
    """
    return os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))


def init_distributed() -> tuple[int, int]:
    """The program's process group (eagle.common.distributed: NCCL for CUDA tensors on GPU nodes)
    and DeepSpeed's op directory; returns (rank, world_size)."""
    extensions_dir()
    return distributed.init()


def ds_config(cfg: DictConfig) -> dict:
    """The DeepSpeed config: conf/deepspeed/*.yaml plus batch, accumulation and clipping from `train`."""
    conf = OmegaConf.to_container(cfg.deepspeed, resolve=True) or {}
    conf.update(
        train_micro_batch_size_per_gpu=1,  # one token-budget batch per micro-step
        gradient_accumulation_steps=int(cfg.train.grad_accum),
        gradient_clipping=float(cfg.train.grad_clip),
        steps_per_print=NEVER,
        zero_allow_untested_optimizer=True,  # a plain torch AdamW: no 45 s op build
        wall_clock_breakdown=False,
    )
    conf.pop("train_batch_size", None)
    return conf


def on_device(conf: dict, device) -> dict:
    """`conf` as `device` runs it: bf16 asked for on a device without bf16 arithmetic (a CPU without
    AVX512-BF16 or AMX, eagle/common/precision.py) trains in fp32, where the head's forward and backward
    ran 19x faster on a 2-core AVX2 EPYC; the exported head keeps train.export_dtype."""
    if conf.get("bf16", {}).get("enabled") and fast_dtype(torch.bfloat16, device) != torch.bfloat16:
        conf = {**conf, "bf16": {**conf["bf16"], "enabled": False}}
    return conf


def compute_dtype(conf: dict) -> torch.dtype:
    if conf.get("bf16", {}).get("enabled"):
        return torch.bfloat16
    if conf.get("fp16", {}).get("enabled"):
        return torch.float16
    return torch.float32


def lr_lambda(warmup: int, total: int, schedule: str, min_ratio: float, world: int = 1):
    """Multiplier of the base lr at optimizer step `s`: linear warmup, then decay to min_ratio by `total`.

    `warmup` and `total` count steps of a one-process run: with `world` ranks the schedule
    advances `world` of them per optimizer step, as EAGLE's (accelerate steps its scheduler
    once per process), so a preset's warmup means the same number of samples at any scale."""

    def f(step: int) -> float:
        s = step * world
        if s < warmup:
            return (s + 1) / (warmup + 1)
        if schedule == "constant" or total <= warmup:
            return 1.0
        progress = min(1.0, (s - warmup) / max(1, total - warmup))
        decay = 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return min_ratio + (1.0 - min_ratio) * decay

    return f


def schedule_span(t, total_steps: int, world: int = 1) -> tuple[int, int]:
    """(warmup, horizon) of the lr schedule in one-process steps (`t`: the train config): the decay ends at
    train.decay_steps, else at the end of this run (`total_steps` optimizer steps of `world` ranks); the
    warmup is train.warmup_steps, or when that is null train.warmup_ratio of that horizon."""
    horizon = t.decay_steps or total_steps * world
    return (t.warmup_steps if t.warmup_steps is not None else round(t.warmup_ratio * horizon)), horizon


def build_engine(head: nn.Module, cfg: DictConfig, conf: dict, total_steps: int, world: int = 1):
    """deepspeed.initialize with the DeepSpeed config `conf` (ds_config), the optimizer of train.optimizer
    and a LambdaLR schedule; returns the engine.

    Its warmup and decay horizon: schedule_span."""
    import deepspeed

    t = cfg.train
    optimizer = build_optimizer(head, t, int(cfg.deepspeed.get("zero_optimization", {}).get("stage", 0)))
    warmup, horizon = schedule_span(t, total_steps, world)
    log.info("optimizer %s, lr %g, %s schedule: warmup %d of %d steps (one-process steps), then to %g of the lr",
             t.optimizer, t.lr, t.schedule, warmup, horizon, t.min_lr_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(warmup, horizon, t.schedule, t.min_lr_ratio, world))
    engine, _, _, _ = deepspeed.initialize(
        model=head, optimizer=optimizer, lr_scheduler=scheduler, config=conf,
        dist_init_required=False,
    )
    return engine


def zero_stage(engine) -> int:
    return int(engine.zero_optimization_stage())


def full_state_dict(engine) -> dict[str, torch.Tensor] | None:
    """The module's complete weights on rank 0 (None elsewhere). Collective: call on all ranks."""
    module = engine.module
    if zero_stage(engine) == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            state = {k: v.detach().clone() for k, v in module.state_dict().items()} if dist.get_rank() == 0 else None
        return state
    if dist.get_rank() != 0:
        return None
    return {k: v.detach().clone() for k, v in module.state_dict().items()}
