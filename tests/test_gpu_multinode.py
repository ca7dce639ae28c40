"""Two nodes without a shared filesystem: per-node store copies, per-node output folders.

The "nodes" are processes on 127.0.0.1 that torchrun starts with --nnodes 2 and their own
--node_rank (GROUP_RANK), each given its own folders. The other tests spawn two gloo ranks directly
(this module imports little at its top: each spawned rank imports it again).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eagle.common.distributed import free_port
from eagle.common.precision import native_bf16
from tests.gloo_ranks import run_in_group

PY = sys.executable


# ---- two gloo ranks, one per "node" --------------------------------------------------------------


def on_two_nodes(fn, *args, timeout: float = 240) -> list[int | None]:
    """Exit codes of two spawned ranks, each alone on its "node", running fn(rank, *args)."""
    nodes = [{"LOCAL_RANK": "0", "GROUP_RANK": str(rank)} for rank in range(2)]
    return run_in_group(fn, args, env=nodes, timeout=timeout)


def _each(rank: int, check, cases: list[list[str]], out: Path) -> None:
    """check(this rank's folder) for every case (a folder per rank); results or one-line errors to out."""
    results = []
    for folders in cases:
        try:
            results.append({"ok": check(folders[rank])})
        except ValueError as e:
            results.append({"error": str(e)})
    (out / f"rank{rank}.json").write_text(json.dumps(results, default=str))


def results(out: Path) -> list[list[dict]]:
    """Per case, the result of each rank."""
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return [list(case) for case in zip(*ranks)]


def _layouts(rank: int, cases: list[list[str]], out: Path) -> None:
    from train.output_layout import output_layout

    _each(rank, lambda folder: output_layout(folder, patience_s=1.0).kind, cases, out)


def test_ranks_find_whether_they_share_output_dir(tmp_path):
    cases = [[str(tmp_path / "one")] * 2, [str(tmp_path / "node0"), str(tmp_path / "node1")]]
    assert on_two_nodes(_layouts, cases, tmp_path) == [0, 0]
    assert results(tmp_path) == [[{"ok": "shared"}] * 2, [{"ok": "node-local"}] * 2]
    assert not list((tmp_path / "one").iterdir()) and not list((tmp_path / "node1").iterdir())  # markers removed


def _stores(rank: int, cases: list[list[str]], out: Path) -> None:
    from train.store_copies import agree_on_store

    _each(rank, agree_on_store, cases, out)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(target_dir, store_dir) of a tiny random target and a complete store of it."""
    from tests.tiny import tiny_target_and_store

    return tiny_target_and_store(tmp_path_factory.mktemp("tiny"))


def copies(store: Path, base: Path) -> list[Path]:
    """The store copied into base/node0/store and base/node1/store (same folder name: same store identity)."""
    out = [base / f"node{r}" / "store" for r in range(2)]
    for path in out:
        shutil.copytree(store, path)
    return out


def test_identical_store_copies_are_read_and_differing_ones_refused(tiny, tmp_path):
    from tests.tiny import tiny_llama, write_tiny_store

    target, store = tiny
    same = [str(p) for p in copies(store, tmp_path / "same")]
    other = tmp_path / "other" / "store"
    write_tiny_store(tiny_llama(seed=0), other, records=40, target_path=str(target))
    cases = [same, [same[0], str(other)], [str(tmp_path / "none0"), str(tmp_path / "none1")]]
    assert on_two_nodes(_stores, cases, tmp_path) == [0, 0]
    identical, differing, absent = results(tmp_path)
    assert identical == [{"ok": True}] * 2
    for result in differing:
        line = result["error"]
        assert "store_dir=" in line and "rank 1" in line and "copies differ" in line and "\n" not in line
    assert absent == [{"ok": False}] * 2  # none anywhere: data_prep builds it (in a shared folder)


def _node_local_checkpoints(rank: int, ckpt_dirs: list[str], out: Path) -> None:
    """Each "node" saves into its own folder with DeepSpeed's node-local storage, then resumes from it."""
    from tests.test_gpu_checkpoint_latest import step, tiny_engine
    from train.checkpoints import resume_from, save_checkpoint, step_tag

    ckpt = Path(ckpt_dirs[rank])
    engine = tiny_engine({"checkpoint": {"use_node_local_storage": True}})
    save_checkpoint(engine, ckpt, step_tag(2), {"step": 2}, keep_last=5)
    step(engine)
    save_checkpoint(engine, ckpt, step_tag(4), {"step": 4}, keep_last=5)
    where = resume_from("auto", ckpt)
    _, client = engine.load_checkpoint(str(where[0]), tag=where[1])
    files = sorted(p.name for p in (ckpt / where[1]).iterdir())
    (out / f"rank{rank}.json").write_text(json.dumps({"tag": where[1], "step": client["step"], "files": files,
                                                      "latest": (ckpt / "latest").read_text()}))


@pytest.mark.slow
def test_each_node_writes_and_resumes_its_own_checkpoint_folder(tmp_path):
    dirs = [str(tmp_path / f"node{r}" / "checkpoints") for r in range(2)]
    assert on_two_nodes(_node_local_checkpoints, dirs, tmp_path) == [0, 0]
    for rank in range(2):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["tag"] == result["latest"] == "step00000004" and result["step"] == 4
        partitions = [f for f in result["files"] if f.endswith("optim_states.pt")]
        assert partitions == [f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"]  # its own only
        assert ".complete" in result["files"] and "mp_rank_00_model_states.pt" in result["files"]


# ---- torchrun --nnodes 2 on 127.0.0.1 -------------------------------------------------------------


def overrides(target: Path, store: Path, out: Path, *extra: str) -> list[str]:
    return ["+model=smollm2_135m", f"model.path={target}", f"store_dir={store}", f"output_dir={out}",
            "wandb.mode=disabled", "train.batch_tokens=256", "train.lr=3e-3", "train.warmup_steps=3",
            "train.eval_fraction=0.2", "train.log_every=5", "train.eval_every=0", "train.progress=false",
            "train.tau_every=0", "deepspeed=zero2_bf16", "train.max_steps=4", "train.save_every=2", *extra]


def torchrun_two_nodes(per_node: list[list[str]], cwd: Path, timeout: int = 400) -> list[subprocess.CompletedProcess]:
    """`torchrun --nnodes 2 --nproc-per-node 1 --node-rank R --master-addr 127.0.0.1 -m train ARGS[R]`."""
    from tests.tiny import clean_env

    port, env = free_port(), clean_env(OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([PY, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                               "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port),
                               "-m", "train", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for rank, args in enumerate(per_node)]
    return [subprocess.CompletedProcess(p.args, p.wait(timeout), *p.communicate()) for p in procs]


def stop_then_resume(tiny, tmp_path, outs: list[Path]) -> None:
    target, store = tiny
    stores = copies(store, tmp_path)
    first = torchrun_two_nodes([overrides(target, stores[r], outs[r], "train.stop_after=2") for r in range(2)],
                               tmp_path)
    assert [r.returncode for r in first] == [0, 0], first[0].stderr[-3000:] + first[1].stderr[-3000:]
    assert "stopped at step 2" in first[0].stderr
    again = torchrun_two_nodes([overrides(target, stores[r], outs[r]) for r in range(2)], tmp_path)
    assert [r.returncode for r in again] == [0, 0], again[0].stderr[-3000:] + again[1].stderr[-3000:]
    logs = again[0].stdout + again[0].stderr
    assert "done: 4 steps" in again[0].stderr and "resumed" in logs and "at step 2" in logs


@pytest.mark.slow
def test_two_nodes_with_their_own_store_copies_train_stop_and_resume(tiny, tmp_path):
    stop_then_resume(tiny, tmp_path, [tmp_path / "out"] * 2)


@pytest.mark.slow
def test_two_nodes_with_their_own_output_folders_train_stop_and_resume(tiny, tmp_path):
    outs = [tmp_path / f"node{r}" / "out" for r in range(2)]
    stop_then_resume(tiny, tmp_path, outs)
    node1 = outs[1] / "checkpoints"
    assert (node1 / "latest").read_text() == "step00000004"
    prefix = "bf16_" if native_bf16() else ""  # bf16 trains in fp32 on a CPU without bf16 arithmetic
    assert [p.name for p in (node1 / "step00000004").glob("*optim_states.pt")] == \
        [f"{prefix}zero_pp_rank_1_mp_rank_00_optim_states.pt"]
