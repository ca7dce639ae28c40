"""One process group for the whole program: data_prep, the trainer and its evaluation share it.

`python -m train` may run data_prep first; whoever starts first creates the group and the
other keeps it, so it has to be right for both: with CUDA present the backend is
"cpu:gloo,cuda:nccl" (NCCL for CUDA tensors, the trainer's statistics and ZeRO's collectives;
gloo for CPU-side collectives), else gloo. Under torchrun or `deepspeed --no_local_rank` the
launcher's RANK / WORLD_SIZE / MASTER_* are used as they are; a plain `python -m ...` gets a
group of one. The timeout is explicit and generous: a rank may wait at a barrier while
another finishes a shard of a TB-scale store.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

TIMEOUT = timedelta(hours=3)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backend() -> str:
    """The process group's backend on this node."""
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def init(timeout: timedelta = TIMEOUT) -> tuple[int, int]:
    """Join (or create) the process group; return (rank, world size). Idempotent."""
    if not dist.is_initialized():
        if "RANK" not in os.environ:  # plain `python -m ...`: a group of one
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0",
                              LOCAL_RANK="0", WORLD_SIZE="1")
        os.environ.setdefault("LOCAL_RANK", os.environ["RANK"])
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group(backend(), timeout=timeout)
    return dist.get_rank(), dist.get_world_size()


def barrier() -> None:
    """Wait for every rank (nothing to wait for in a group of one)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
