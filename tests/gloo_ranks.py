"""A few processes on 127.0.0.1 that join one process group as ranks of a torchrun job would.

    procs = start_ranks(fn, world=2, args=(out_dir,), env={"EAGLE_DIST_TIMEOUT_MIN": "0.05"})
    codes = join_all(procs, timeout=60)        # None for a rank still running (then killed)
    codes = run_in_group(fn, args=(out_dir,))  # fn runs inside a gloo group the ranks join and leave together

`fn(rank, *args)` must be a module-level function of an importable module (the processes are
spawned). Each process gets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and `env`
(or `env[rank]` when `env` is a list) before `fn` runs; fn itself joins the group
(eagle.common.distributed.init), or run_in_group joins and leaves one around it.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from eagle.common import distributed
from eagle.common.distributed import free_port

DIST_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


def _rank_main(fn, rank: int, world: int, port: int, env: dict, args: tuple) -> None:
    for k in DIST_VARS:  # a test run in-process before may have left its own
        os.environ.pop(k, None)
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", **env})
    fn(rank, *args)


def start_ranks(fn, world: int = 2, args: tuple = (), env: dict | list[dict] | None = None) -> list:
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    envs = env if isinstance(env, list) else [env or {}] * world
    procs = [ctx.Process(target=_rank_main, args=(fn, rank, world, port, envs[rank], args)) for rank in range(world)]
    for p in procs:
        p.start()
    return procs


def join_all(procs: list, timeout: float) -> list[int | None]:
    """Exit codes once all ended, or after `timeout` s (None for a rank still running, which is killed)."""
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    codes = [p.exitcode for p in procs]
    stop(procs)
    return codes


def stop(procs: list) -> None:
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(10)


def _in_group(rank: int, fn, *args) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    fn(rank, *args)
    distributed.leave()


def run_in_group(fn, args: tuple = (), world: int = 2, env: dict | list[dict] | None = None,
                 timeout: float = 240) -> list[int | None]:
    """Exit codes of `world` ranks that join a gloo group, run fn(rank, *args) and leave the group together."""
    return join_all(start_ranks(_in_group, world, (fn, *args), env), timeout)
