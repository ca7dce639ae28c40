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
import time
import uuid
from datetime import timedelta
from pathlib import Path

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


def merged(mine: dict) -> dict:
    """The union of every rank's dict (all_gather_object); this rank's own in a group of one."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return dict(mine)
    parts: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine)
    return {k: v for part in parts for k, v in part.items()}


def check_shared(path: str | Path, what: str, patience_s: float = 15.0) -> None:
    """Every rank must see the same folder `path` (one filesystem across nodes), or all ranks stop
    with the same one-line error, before any rank decides anything from what it sees there.

    Rank 0 writes a marker; every rank looks for it (waiting out a network filesystem's lookup
    cache for up to `patience_s`). Without this, a store written on per-node disks looks
    complete with a fraction of its shards, and ranks disagree about resuming and hang."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    path = Path(path).resolve()
    path.mkdir(parents=True, exist_ok=True)
    token = [uuid.uuid4().hex if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(token, src=0)
    marker = path / f".shared-check-{token[0]}"
    if dist.get_rank() == 0:
        marker.write_text(socket.gethostname())
    dist.barrier()
    deadline = time.monotonic() + patience_s
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(1.0)
    seen: list = [None] * dist.get_world_size()
    dist.all_gather_object(seen, (marker.exists(), socket.gethostname()))
    dist.barrier()
    if dist.get_rank() == 0:
        marker.unlink(missing_ok=True)
    blind = [(rank, host) for rank, (ok, host) in enumerate(seen) if not ok]
    if blind:
        rank, host = blind[0]
        raise ValueError(f"{what}={path} is not shared between the nodes: rank {rank} on {host} cannot see a file "
                         f"rank 0 wrote there ({len(blind)} of {len(seen)} ranks cannot); put {what} on a filesystem "
                         "every node mounts (NFS, Lustre, ...) and start again")
