"""One OpenMP team at a time (eagle/common/openmp_team.py): background work parked at `pause` holds no
OpenMP workers, and the model hands the cores over when the work goes on. A second team alive on a
2-core machine made the other thread's compiled forwards ~2x slower (`python -m evaluation.thread_teams`).

The workers are counted as the process's OS threads, in a fresh process (no other test's threads)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
import torch

import eagle.model
import eagle.tuning.background as background
from eagle.common.openmp_team import release_team
from eagle.decoding.settings import TreeSettings
from eagle.model import EaModel
from evaluation.thread_teams import main as thread_teams
from tests.tiny import near_bigram_pair, prompt

COUNT_THREADS = r"""
import json, os, threading, time, torch
from eagle.common.openmp_team import release_team
from eagle.tuning.background import BackgroundWork

def tasks():
    return len(os.listdir("/proc/self/task"))

torch.set_num_threads(2)
x = torch.randn(1 << 22)
seen = {"base": tasks()}
x.add(1)  # a parallel region: the main thread's team (one worker)
seen["main team"] = tasks()

class Work(BackgroundWork):
    def _work(self):
        counted.wait()  # the main thread counts its threads before this one starts a team
        torch.set_num_threads(2)
        x.add(1)
        seen["work's team"] = tasks()
        parking.set()
        self.pause()

parking, counted = threading.Event(), threading.Event()
work = Work()
work.idle.clear()  # the model generates: the work parks at its pause
work.start()
seen["work started"] = tasks()
counted.set()
parking.wait()
time.sleep(0.5)
seen["work parked"] = tasks()
work.resume()
work.done.wait()
print(json.dumps(seen))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or not release_team(), reason="libgomp on Linux only")
def test_background_work_parked_at_a_pause_holds_no_openmp_workers():
    out = subprocess.run([sys.executable, "-c", COUNT_THREADS], capture_output=True, text=True, timeout=120, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    base = seen["base"]
    assert seen["main team"] == base + 1  # the main thread's worker
    assert seen["work started"] == base + 1  # start() ended it; the work's thread came
    assert seen["work's team"] == base + 2  # the work's own worker
    assert seen["work parked"] == base + 1  # released before waiting: the generation has the cores


def test_the_model_releases_its_team_when_it_hands_the_cores_to_the_warmup(monkeypatch, tmp_path):
    """At the end of a generation beside a warm-up, and in `wait_ready`, the calling thread's team ends."""
    monkeypatch.setenv("EAGLE_CACHE", str(tmp_path))
    released = []
    monkeypatch.setattr(background, "release_team", lambda: released.append(threading.get_ident()))
    monkeypatch.setattr(eagle.model, "release_team", lambda: released.append(threading.get_ident()))
    target, head = near_bigram_pair(13)
    model = EaModel.from_modules(target, head, settings=TreeSettings(total_token=4, depth=2, top_k=4, lookup=0),
                                 compile=True)
    assert threading.get_ident() in released  # start()
    released.clear()
    if model.warmup is not None:
        model.eagenerate(prompt(2, 5), max_new_tokens=3)
        assert threading.get_ident() in released or model.warmup is None  # resume(), unless it was adopted first
    released.clear()
    pending = model.warmup is not None
    assert model.wait_ready(timeout=600)
    assert (threading.get_ident() in released) == pending  # wait_ready, while there was work


def test_thread_teams_times_each_situation(tiny_dir, capsys):
    threads = torch.get_num_threads()
    try:
        result = thread_teams(["--base", str(tiny_dir), "--rounds", "1", "--reps", "2"])
    finally:
        torch.set_num_threads(threads)  # main sets the threads it times with
    assert len(result) == 5 and all(ms > 0 for ms in result.values())
    assert "second thread, the main thread's team released" in capsys.readouterr().out


def test_the_shard_writer_thread_ends_its_openmp_workers_after_each_write(monkeypatch, tmp_path):
    """data_prep writes shard k on a thread while shard k+1's forward runs: that thread's team must not
    outlive the write."""
    import data_prep.shard_writer as shard_writer

    released, written = [], []
    monkeypatch.setattr(shard_writer, "release_team", lambda: released.append(threading.current_thread().name))

    def write(path, n):
        torch.ones(1 << 20).add(n)  # a parallel loop on the writer's thread
        return {"file": path.name}

    with shard_writer.ShardWriter(lambda k, entry: written.append(k), background=True) as writer:
        for k in range(3):
            writer.submit(k, tmp_path / f"{k}.safetensors", write, k)
    assert written == [0, 1, 2]
    assert len(released) == 3 and all(name.startswith("shard-writer") for name in released)
