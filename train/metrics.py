"""Summed training statistics: accumulated over micro-batches, reduced over ranks, then averaged (loss.summarize).

The sums live on the device the losses are computed on (CUDA on a GPU node), so accumulating
never mixes devices and the all-reduce runs on NCCL's device; only `loss.summarize` reads them
back to Python floats, once per logging window."""

from __future__ import annotations

import torch
import torch.distributed as dist

from train.loss import SUM_KEYS

STAT_KEYS = (*SUM_KEYS, "pairs")


def zeros(device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Empty sums, one float64 scalar per statistic, on `device` (the model's)."""
    return {k: torch.zeros((), dtype=torch.float64, device=device) for k in STAT_KEYS}


def accumulate(into: dict[str, torch.Tensor], sums: dict[str, torch.Tensor], pairs: int) -> None:
    """Add one micro-batch's loss sums and its pair count (in place)."""
    for k, v in sums.items():
        into[k] += v
    into["pairs"] += pairs


def all_reduce(sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The sums over all ranks (this rank's alone in a group of one), reduced on their own device."""
    keys = sorted(sums)
    flat = torch.stack([sums[k] for k in keys])
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(flat)
    return dict(zip(keys, flat))
