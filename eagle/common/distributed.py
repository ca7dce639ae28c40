"""One process group for the whole program: data_prep, the trainer and its evaluation share it.

`python -m train` may run data_prep first; whoever starts first creates the group and the
other keeps it, so it has to be right for both: with CUDA present the backend is
"cpu:gloo,cuda:nccl" (NCCL for CUDA tensors, the trainer's statistics and ZeRO's collectives;
gloo for CPU-side collectives), else gloo. Under torchrun, srun or `deepspeed --no_local_rank`
the launcher's RANK / WORLD_SIZE / MASTER_* are used as they are; a plain `python -m ...` gets
a group of one.

Timeouts. The group's collectives (DeepSpeed's, the trainer's statistics) give up after
EAGLE_DIST_TIMEOUT_MIN minutes (30 by default): a dead or desynchronized rank ends the job
instead of holding every GPU for hours. On GPU nodes NCCL's asynchronous error handling is on
(TORCH_NCCL_ASYNC_ERROR_HANDLING=1 unless set), so a timed-out NCCL collective ends the process
with the watchdog's report. Where ranks legitimately wait longer for one another (a rank
finishing its shards of a TB-scale store, rank 0 measuring τ or exporting), they wait in
`barrier`, `merged`, `same_everywhere` and `check_shared`: these run on a second, gloo-only group
whose timeout is EAGLE_DIST_LONG_TIMEOUT_MIN (180 by default), and name the ranks missing.

Devices. `device_index` is the one answer to "which GPU is mine": LOCAL_RANK (torchrun), else
SLURM_LOCALID (srun), else OMPI_COMM_WORLD_LOCAL_RANK (mpirun), else RANK modulo the ranks per
node (LOCAL_WORLD_SIZE, else the visible GPUs); 0 when the process sees one GPU (a task
launched with one GPU of its own).

Leaving. A command that joined the group leaves it at its end with `leave()`: every rank waits
for the others (rank 0 may still be measuring τ or publishing), then the groups are destroyed
while the interpreter is whole. A rank that exits holding a group destroys it during the
interpreter's teardown, where gloo's threads can abort the process (SIGABRT, "terminate called
without an active exception": torchrun then reports a finished run as failed), and NCCL warns
that the group was never destroyed.
"""

from __future__ import annotations

import gc
import math
import os
import socket
import time
import uuid
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

TIMEOUT_VAR, LONG_TIMEOUT_VAR = "EAGLE_DIST_TIMEOUT_MIN", "EAGLE_DIST_LONG_TIMEOUT_MIN"
TIMEOUT_MIN, LONG_TIMEOUT_MIN = 30.0, 180.0
LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
_LONG: dict = {}  # the waiting group, made on first use: {"world": the default group, "group": its gloo twin}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backend() -> str:
    """The process group's backend on this node."""
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def minutes_from_env(var: str, default: float) -> timedelta:
    """The timeout `var` sets in minutes (a positive number), else `default` minutes."""
    raw = os.environ.get(var, "").strip()
    if not raw:
        return timedelta(minutes=default)
    try:
        minutes = float(raw)
    except ValueError:
        minutes = math.nan
    if not (minutes > 0 and math.isfinite(minutes)):
        raise ValueError(f"{var}={raw!r}: expected a positive number of minutes")
    return timedelta(minutes=minutes)


def collective_timeout() -> timedelta:
    """How long a collective of the group waits for a missing rank: EAGLE_DIST_TIMEOUT_MIN (30 min)."""
    return minutes_from_env(TIMEOUT_VAR, TIMEOUT_MIN)


def long_timeout() -> timedelta:
    """How long `barrier` / `merged` / `check_shared` wait: EAGLE_DIST_LONG_TIMEOUT_MIN (180 min)."""
    return minutes_from_env(LONG_TIMEOUT_VAR, LONG_TIMEOUT_MIN)


def local_rank() -> tuple[int, str]:
    """This process's rank on its node, and where it comes from (for messages): the first of
    LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK that is set, else RANK modulo the ranks
    per node (LOCAL_WORLD_SIZE, else the visible CUDA devices), else RANK."""
    for var in LOCAL_RANK_VARS:
        if os.environ.get(var, "").strip():
            return _int_var(var), f"{var}={os.environ[var].strip()}"
    rank = _int_var("RANK") if os.environ.get("RANK", "").strip() else 0
    if os.environ.get("LOCAL_WORLD_SIZE", "").strip():
        per_node = _int_var("LOCAL_WORLD_SIZE")
        return rank % per_node, f"RANK={rank} mod LOCAL_WORLD_SIZE={per_node}"
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count:
        return rank % count, f"RANK={rank} mod {count} visible CUDA devices"
    return rank, f"RANK={rank}"


def device_index() -> int:
    """This process's CUDA device among those it sees: its local rank, or 0 when it sees one GPU."""
    count = torch.cuda.device_count()
    if count <= 1:
        return 0
    index, source = local_rank()
    if index >= count:
        raise RuntimeError(f"local rank {index} ({source}) but this process sees only {count} visible CUDA devices "
                           f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): start at most "
                           f"{count} ranks per node, or give each task one GPU")
    return index


def _int_var(var: str) -> int:
    raw = os.environ[var].strip()
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{var}={raw!r}: expected a rank (an integer >= 0)")
    return value


def init(timeout: timedelta | None = None) -> tuple[int, int]:
    """Join (or create) the process group; return (rank, world size). Idempotent.
    `timeout`: of the group's collectives (default `collective_timeout()`)."""
    if not dist.is_initialized():
        if "RANK" not in os.environ:  # plain `python -m ...`: a group of one
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0",
                              LOCAL_RANK="0", WORLD_SIZE="1")
        timeout = timeout or collective_timeout()
        long_timeout()  # a bad value stops the job here, not at its first long wait
        if torch.cuda.is_available():
            index = device_index()
            os.environ["LOCAL_RANK"] = str(index)  # DeepSpeed takes LOCAL_RANK as its device index
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
            torch.cuda.set_device(index)
        else:
            os.environ.setdefault("LOCAL_RANK", str(local_rank()[0]))
        dist.init_process_group(backend(), timeout=timeout)
    return dist.get_rank(), dist.get_world_size()


def _alone() -> bool:
    return not dist.is_initialized() or dist.get_world_size() == 1


def waiting_group():
    """The gloo group of the long waits, made on first use. Every rank makes it at the same call
    (the first long wait of the program, itself a call every rank makes), as new_group requires."""
    world = dist.group.WORLD
    if _LONG.get("world") is not world:
        _LONG.update(world=world, group=dist.new_group(backend="gloo", timeout=long_timeout()))
    return _LONG["group"]


def _arrive(what: str) -> None:
    """Wait on the waiting group until every rank reaches `what`; name the missing ranks when
    EAGLE_DIST_LONG_TIMEOUT_MIN passes first."""
    timeout = long_timeout()
    try:
        dist.monitored_barrier(waiting_group(), timeout=timeout, wait_all_ranks=True)
    except RuntimeError as e:
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RuntimeError(f"rank {dist.get_rank()} waited {timeout.total_seconds() / 60:.3g} min "
                           f"({LONG_TIMEOUT_VAR}) at {what} and not every rank arrived: {detail}") from e


def leave() -> None:
    """Leave the process group together with every other rank (no-op when not in one); every rank
    of a group must call it. `init()` afterwards joins a new group."""
    if not dist.is_initialized():
        return
    barrier("the end of the job")
    _LONG.clear()  # its handle would keep the gloo twin alive until the interpreter's teardown
    dist.destroy_process_group()
    gc.collect()  # whatever else held a group goes now, not at exit


def barrier(what: str = "a barrier") -> None:
    """Wait for every rank, up to EAGLE_DIST_LONG_TIMEOUT_MIN (nothing to wait for in a group of one):
    where one rank may work alone for long while the others wait."""
    if not _alone():
        _arrive(what)


def merged(mine: dict, what: str = "a merge of every rank's results") -> dict:
    """The union of every rank's dict (all_gather_object on the waiting group, after every rank
    arrived); this rank's own in a group of one."""
    if _alone():
        return dict(mine)
    _arrive(what)
    parts: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine, group=waiting_group())
    return {k: v for part in parts for k, v in part.items()}


def mismatch(values: list, what: str) -> str | None:
    """The one-line error when the ranks' `values` (in rank order) differ, else None."""
    odd = [rank for rank, value in enumerate(values) if value != values[0]]
    if not odd:
        return None
    return (f"{what} differs between ranks: rank 0 has {values[0]}, rank {odd[0]} has {values[odd[0]]} "
            f"({len(odd)} of {len(values)} ranks differ from rank 0)")


def same_everywhere(value, what: str, fix: str = "") -> None:
    """Stop every rank with the same ValueError (naming rank 0's value and a differing one, then
    `fix`) when `value` is not the same on all ranks. Under a launcher (WORLD_SIZE > 1) every
    rank must call it; it joins the process group first."""
    if not dist.is_initialized() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        init()
    if _alone():
        return
    values = merged({dist.get_rank(): value}, f"the comparison of {what}")
    message = mismatch([values[rank] for rank in range(dist.get_world_size())], what)
    if message:
        raise ValueError(f"{message}; {fix}" if fix else message)


def check_shared(path: str | Path, what: str, patience_s: float = 15.0) -> None:
    """Every rank must see the same folder `path` (one filesystem across nodes), or all ranks stop
    with the same one-line error, before any rank decides anything from what it sees there.

    Rank 0 writes a marker; every rank looks for it (waiting out a network filesystem's lookup
    cache for up to `patience_s`). Without this, a store written on per-node disks looks
    complete with a fraction of its shards, and ranks disagree about resuming and hang."""
    if _alone():
        return
    path = Path(path).resolve()
    path.mkdir(parents=True, exist_ok=True)
    _arrive(f"the check that {what} is shared")  # ranks may come from unequal work (a download, a store)
    group = waiting_group()
    token = [uuid.uuid4().hex if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(token, src=0, group=group)
    marker = path / f".shared-check-{token[0]}"
    if dist.get_rank() == 0:
        marker.write_text(socket.gethostname())
    dist.barrier(group=group)
    deadline = time.monotonic() + patience_s
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(1.0)
    seen: list = [None] * dist.get_world_size()
    dist.all_gather_object(seen, (marker.exists(), socket.gethostname()), group=group)
    dist.barrier(group=group)
    if dist.get_rank() == 0:
        marker.unlink(missing_ok=True)
    blind = [(rank, host) for rank, (ok, host) in enumerate(seen) if not ok]
    if blind:
        rank, host = blind[0]
        raise ValueError(f"{what}={path} is not shared between the nodes: rank {rank} on {host} cannot see a file "
                         f"rank 0 wrote there ({len(blind)} of {len(seen)} ranks cannot); put {what} on a filesystem "
                         "every node mounts (NFS, Lustre, ...) and start again")
