"""Temporary shard files a killed rank left behind: removed on the next start, before the disk check.

A rank writes `shard-N.safetensors.tmp-PID` and renames it when whole; a kill leaves the temporary
file. The next data_prep run removes the ones whose process is gone (logging each), frees their
bytes before it measures the free disk, and keeps a file whose process still runs on this host.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from data_prep import pipeline
from data_prep.store import read_manifest, shard_name
from tests.tiny import crash_after
from tests.tiny import data_prep_config as config


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "chats.jsonl"
    path.write_text("\n".join(json.dumps({"conversations": [
        {"from": "human", "value": f"What is {i} times 3?"}, {"from": "gpt", "value": f"{3 * i}, " * (i + 1)}]})
        for i in range(16)))
    return path


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_dead_ranks_tmp_files_are_removed_and_logged_a_live_ones_kept(tiny_dir, chats, tmp_path, monkeypatch,
                                                                        caplog):
    cfg = config(tiny_dir, chats, tmp_path / "s")
    monkeypatch.setattr(pipeline, "write_shard", crash_after(pipeline.write_shard, 1))
    with pytest.raises(KeyboardInterrupt):
        pipeline.prepare(cfg)
    monkeypatch.undo()
    out = tmp_path / "s"
    dead = dead_pid()
    stale = [out / f"{shard_name(2)}.tmp-{dead}", out / f"manifest.json.tmp-{dead}"]
    for path in stale:
        path.write_bytes(b"\0" * 4096)  # what a SIGKILL in the middle of a write leaves
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    running = out / f"{shard_name(3)}.tmp-{live.pid}"
    running.write_bytes(b"\0" * 100)
    seen_by_plan = []
    real_plan = pipeline.store_plan

    def plan(*args, **kwargs):  # the free-disk figure is taken here: the stale bytes must be gone by then
        seen_by_plan.append([p.name for p in stale if p.exists()])
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(pipeline, "store_plan", plan)
    try:
        with caplog.at_level(logging.INFO, logger="data_prep"):
            pipeline.prepare(cfg)
        assert running.exists(), "the tmp file of a process that still runs was removed"
    finally:
        live.kill()
        live.wait()
    assert read_manifest(out)["complete"]
    assert not any(p.exists() for p in stale)
    assert seen_by_plan == [[]]
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for path in stale:
        assert path.name in logged and "removed" in logged
    assert running.name in logged  # kept, and said so


def test_a_tmp_file_of_this_process_is_stale_too(tiny_dir, chats, tmp_path):
    """A write of this very process that an exception cut short (a KeyboardInterrupt inside save) is not
    running any more: one job writes a store at a time, so the file is removed."""
    import os

    out = tmp_path / "s"
    out.mkdir()
    mine = out / f"{shard_name(0)}.tmp-{os.getpid()}"
    mine.write_bytes(b"\0" * 10)
    pipeline.prepare(config(tiny_dir, chats, out, **{"data.limit": 4}))
    assert not mine.exists()
