"""eagle/common/child_process.py: a child that runs a job of its own starts clean and fails loudly."""

from __future__ import annotations

import os
import sys

import pytest

from eagle.common.child_process import child_env, run_logged


def test_a_child_gets_no_launcher_rank_variables_and_a_foreign_one_no_venv(monkeypatch):
    for var, value in dict(RANK="0", WORLD_SIZE="1", MASTER_PORT="29500", PYTHONPATH="/ours", KEEP="yes").items():
        monkeypatch.setenv(var, value)
    env = child_env(2)
    assert "RANK" not in env and "MASTER_PORT" not in env and env["OMP_NUM_THREADS"] == "2"
    assert env["PYTHONPATH"] == "/ours" and env["KEEP"] == "yes"
    foreign = child_env(None, foreign=True, EXTRA="1")
    assert "PYTHONPATH" not in foreign and foreign["EXTRA"] == "1"
    assert foreign.get("OMP_NUM_THREADS") == os.environ.get("OMP_NUM_THREADS")  # None: left as it is


def test_a_failed_or_killed_child_is_reported_with_its_logs_tail(tmp_path):
    log = tmp_path / "child.log"
    with pytest.raises(RuntimeError, match=r"failed \(exit 3\)[^\n]*child.log ends:\nlast words"):
        run_logged([sys.executable, "-c", "print('last words'); raise SystemExit(3)"], log, child_env(1), tmp_path)
    with pytest.raises(RuntimeError, match=r"was killed by SIGKILL \(out of memory\?\)"):
        run_logged([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], log,
                   child_env(1), tmp_path)
    assert run_logged([sys.executable, "-c", "print('ok')"], log, child_env(1), tmp_path) >= 0
    assert log.read_text() == "ok\n"
