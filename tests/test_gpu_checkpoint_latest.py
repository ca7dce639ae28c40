"""`latest` names only whole checkpoints; resume=auto skips a checkpoint a dying rank left cut.

Two gloo ranks on 127.0.0.1 run a tiny DeepSpeed ZeRO-2 engine (each rank writes its own optimizer
partition). A rank that dies while writing its partition must leave `latest` on the checkpoint
before; a checkpoint whose `latest` moved before a rank's partition was whole (DeepSpeed's own
save_checkpoint writes `latest` from rank 0 without waiting) must not be resumed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.gloo_ranks import run_in_group
from train.checkpoint_files import MARKER, problem, write_marker, write_text_atomic
from train.checkpoints import resume_from, save_checkpoint, step_tag

def tiny_engine(extra: dict | None = None):
    """A ZeRO-2 DeepSpeed engine over one Linear layer (bf16, CPU; `extra`: more DeepSpeed config), one
    optimizer step taken."""
    import deepspeed

    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
    torch.manual_seed(0)
    model = nn.Linear(16, 16)
    conf = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}, "bf16": {"enabled": True},
            "zero_allow_untested_optimizer": True, "steps_per_print": 10**12, **(extra or {})}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
                                      config=conf, dist_init_required=False)
    step(engine)
    return engine


def step(engine) -> None:
    x = torch.ones(2, 16, dtype=torch.bfloat16)
    engine.backward(engine(x).float().pow(2).sum())
    engine.step()


def _dies_inside_the_save(rank: int, ckpt: Path, out: Path) -> None:
    engine = tiny_engine()
    save_checkpoint(engine, ckpt, step_tag(2), {"step": 2}, keep_last=5)
    step(engine)
    if rank == 1:
        real_save = torch.save

        def save_and_die(obj, f, *args, **kwargs):  # half of the partition reaches the disk, then the rank dies
            real_save(obj, f, *args, **kwargs)
            if "optim_states" in str(f) and step_tag(4) in str(f):
                with open(f, "r+b") as fh:
                    fh.truncate(os.path.getsize(f) // 2)
                os._exit(3)

        torch.save = save_and_die
    try:
        save_checkpoint(engine, ckpt, step_tag(4), {"step": 4}, keep_last=5)
        outcome = "saved"
    except Exception as e:  # the peer's death reaches rank 0 as a gloo error
        outcome = f"{type(e).__name__}: {e}"[:300]
    (out / f"rank{rank}.json").write_text(json.dumps({"outcome": outcome}))


@pytest.mark.slow
def test_a_rank_dying_inside_the_save_leaves_latest_on_the_checkpoint_before(tmp_path):
    ckpt = tmp_path / "checkpoints"
    codes = run_in_group(_dies_inside_the_save, (ckpt, tmp_path))
    assert codes[1] == 3, codes
    assert (ckpt / "latest").read_text() == step_tag(2)
    outcome = json.loads((tmp_path / "rank0.json").read_text())["outcome"]
    assert outcome != "saved"  # rank 0 learns of the death instead of declaring the checkpoint done
    assert (ckpt / step_tag(2) / MARKER).exists() and not (ckpt / step_tag(4) / MARKER).exists()
    assert not list(ckpt.glob(".latest.tmp-*"))


def _deepspeed_moved_latest_early(rank: int, ckpt: Path, out: Path) -> None:
    """Checkpoints saved by DeepSpeed alone (rank 0 writes `latest` as soon as its own files are done);
    rank 1's partition of step 4 is then cut, as a rank killed in the middle of writing it leaves it."""
    engine = tiny_engine()
    engine.save_checkpoint(str(ckpt), tag=step_tag(2), client_state={"step": 2})
    step(engine)
    engine.save_checkpoint(str(ckpt), tag=step_tag(4), client_state={"step": 4})
    torch.distributed.barrier()
    if rank == 1:
        part = next((ckpt / step_tag(4)).glob("*zero_pp_rank_1_*optim_states.pt"))
        with open(part, "r+b") as f:
            f.truncate(part.stat().st_size // 2)
    torch.distributed.barrier()
    where = resume_from("auto", ckpt)
    tag = None if where is None else where[1]
    path, client = engine.load_checkpoint(str(ckpt), tag=tag)
    (out / f"rank{rank}.json").write_text(json.dumps({"tag": tag, "step": client and client["step"]}))


@pytest.mark.slow
def test_resume_skips_a_checkpoint_whose_partition_a_dying_rank_cut(tmp_path):
    ckpt = tmp_path / "checkpoints"
    assert run_in_group(_deepspeed_moved_latest_early, (ckpt, tmp_path)) == [0, 0]
    assert (ckpt / "latest").read_text().strip() == step_tag(4)
    for rank in range(2):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == {"tag": step_tag(2), "step": 2}


def test_latest_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    latest = tmp_path / "latest"
    write_text_atomic(latest, step_tag(2))

    def crash(fd):
        raise OSError(5, "Input/output error")  # the machine goes down between write and rename

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError):
        write_text_atomic(latest, step_tag(4))
    assert latest.read_text() == step_tag(2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]


def test_a_marker_lists_the_files_and_a_folder_without_one_is_unfinished(tmp_path):
    done, cut = tmp_path / step_tag(2), tmp_path / step_tag(4)
    for folder in (done, cut):
        folder.mkdir()
        torch.save({"w": torch.zeros(64)}, folder / "mp_rank_00_model_states.pt")
    write_marker(done)
    assert problem(done, 0, markers_in_use=True) is None
    assert "did not finish" in problem(cut, 0, markers_in_use=True)
    assert problem(cut, 0, markers_in_use=False) is None  # whole files, no marker: DeepSpeed saved it alone
    with open(done / "mp_rank_00_model_states.pt", "r+b") as f:
        f.truncate(100)
    assert "mp_rank_00_model_states.pt has 100 bytes" in problem(done, 0, markers_in_use=True)
    (done / MARKER).unlink()
    assert "mp_rank_00_model_states.pt is cut short" in problem(done, 0, markers_in_use=False)
    assert resume_from("auto", tmp_path) == (tmp_path, step_tag(4))  # the newest whole one
