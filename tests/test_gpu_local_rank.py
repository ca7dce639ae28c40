"""Which GPU a rank takes, under each launcher: torchrun (LOCAL_RANK), srun (SLURM_LOCALID),
mpirun (OMPI_COMM_WORLD_LOCAL_RANK), or only RANK; and with one visible GPU per task.

CUDA is pretended: torch.cuda.is_available / device_count / set_device are replaced, and the
process group is recorded instead of joined."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from eagle.common import distributed
from eagle.targets.resolve import local_device

LAUNCHER_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_WORLD_SIZE", "RANK")


@pytest.fixture
def gpus(monkeypatch):
    """`gpus(n, **env)`: a node with n visible CUDA devices and only `env` of the launcher variables;
    returns the list set_device is called with."""
    chosen: list[int] = []

    def node(count: int, **env: str) -> list[int]:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "set_device", lambda index: chosen.append(int(index)))
        for key in LAUNCHER_VARS:
            monkeypatch.delenv(key, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        return chosen

    return node


@pytest.mark.parametrize("count, env, index", [
    (8, {"RANK": "11", "LOCAL_RANK": "3"}, 3),  # torchrun
    (8, {"RANK": "11"}, 3),  # a launcher that sets only RANK: 11 mod 8 GPUs
    (8, {"RANK": "11", "SLURM_LOCALID": "5"}, 5),  # srun
    (8, {"RANK": "11", "OMPI_COMM_WORLD_LOCAL_RANK": "6"}, 6),  # mpirun
    (8, {"RANK": "6", "LOCAL_WORLD_SIZE": "4"}, 2),  # 4 ranks per node
    (1, {"RANK": "11", "SLURM_LOCALID": "3"}, 0),  # srun --gpus-per-task=1: the one visible GPU
    (1, {"RANK": "11", "LOCAL_RANK": "3"}, 0),
])
def test_local_device_index(gpus, count, env, index):
    gpus(count, **env)
    assert local_device() == torch.device("cuda", index)


def test_init_sets_the_local_device_not_the_global_rank(gpus, monkeypatch):
    """Node 2 of 8-GPU nodes under a RANK-only launcher: rank 11 is cuda:3, not cuda:11."""
    chosen = gpus(8, RANK="11", WORLD_SIZE="16", MASTER_ADDR="127.0.0.1", MASTER_PORT="29999")
    created: list[str] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: bool(created))
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kwargs: created.append(backend))
    monkeypatch.setattr(dist, "get_rank", lambda *a: 11)
    monkeypatch.setattr(dist, "get_world_size", lambda *a: 16)
    distributed.init()
    assert chosen == [3]
    import os

    assert os.environ["LOCAL_RANK"] == "3"  # DeepSpeed takes LOCAL_RANK as its device index


def test_a_local_rank_beyond_the_visible_devices_is_named(gpus):
    gpus(4, RANK="5", LOCAL_RANK="5")
    with pytest.raises(RuntimeError, match=r"LOCAL_RANK=5.*4 visible CUDA devices"):
        local_device()


def test_without_cuda_the_device_is_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert local_device() == torch.device("cpu")
