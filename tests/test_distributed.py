"""The program's one process group (eagle/common/distributed.py), checked on a CPU with CUDA pretended."""

from __future__ import annotations

import torch
import torch.distributed as dist

from eagle.common import distributed
from train.engine import init_distributed


def pretend_cuda(monkeypatch, world: int = 2) -> list[str]:
    """torch.cuda.is_available() is True and init_process_group records its backend instead of joining."""
    created: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    monkeypatch.setattr(dist, "is_initialized", lambda: bool(created))
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kwargs: created.append(backend))
    monkeypatch.setattr(dist, "get_rank", lambda *a: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda *a: world)
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(key, value)
    return created


def test_data_prep_then_training_share_one_group_that_reduces_cuda_tensors(monkeypatch):
    """`python -m train` runs data_prep first, which creates the group; the trainer keeps it. On a
    GPU node that group must carry NCCL for the trainer's CUDA tensors (gloo cannot reduce them)."""
    created = pretend_cuda(monkeypatch)
    assert distributed.init() == (0, 2)  # data_prep.pipeline.prepare's first call
    assert init_distributed() == (0, 2)  # the trainer's, later in the same process
    assert created == ["cpu:gloo,cuda:nccl"]


def test_without_cuda_the_group_is_gloo(monkeypatch):
    created = pretend_cuda(monkeypatch, world=1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    distributed.init()
    assert created == ["gloo"]


def _threads() -> int:
    import os

    return len(os.listdir("/proc/self/task"))


def _join_wait_leave(rank: int, out) -> None:
    import json
    from pathlib import Path

    before = _threads()
    distributed.init()
    distributed.merged({rank: rank}, "a test's merge")  # makes the gloo waiting group and uses it
    during = _threads()
    distributed.leave()
    Path(out, f"rank{rank}.json").write_text(json.dumps([before, during, _threads(), dist.is_initialized()]))


def test_leaving_stops_every_thread_the_groups_started(tmp_path):
    """After leave() a rank holds no gloo thread: nothing is left for the interpreter's teardown,
    where a live group can abort the finished process (SIGABRT) under torchrun."""
    import json

    from tests.gloo_ranks import join_all, start_ranks

    assert join_all(start_ranks(_join_wait_leave, args=(tmp_path,)), timeout=120) == [0, 0]
    for rank in range(2):
        before, during, after, joined = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert during > before and after == before and not joined
