"""`python -m evaluation.thread_teams`: a compiled forward's cost beside another thread's OpenMP team.

    python -m evaluation.thread_teams --threads 2 --rounds 3

Times the target's compiled plain step (one row, eagle/compiled/target_graphs.py) in five
situations, in interleaved rounds, and prints the median ms of each:

- the main thread alone;
- the main thread while another thread that ran the same forward waits, keeping its OpenMP team
  (what a background compile or tuner parked between two steps did), or having released it
  (`release_team`, eagle/common/openmp_team.py: what it does now);
- a second thread (the background tuner's place) while the main thread's team is alive, or
  after the main thread released it.

On a machine with as many cores as threads, libgomp makes the idle workers of a process that holds
more of them than it has cores sleep between parallel regions; a forward has hundreds of them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import threading
import time
from collections.abc import Callable

import torch

from eagle.common.openmp_team import release_team
from eagle.compiled.target_graphs import CompiledTarget
from eagle.targets.resolve import load_causal_lm, resolve_target
from evaluation.forward_widths import _call, prefill_context


def median_ms(call: Callable[[], None], reps: int, before: Callable[[], object] | None = None) -> float:
    """The median ms of `reps` calls, on the calling thread; `before`, untimed, ahead of each."""
    spent = []
    with torch.inference_mode():
        for _ in range(reps):
            if before is not None:
                before()
            start = time.perf_counter()
            call()
            spent.append(time.perf_counter() - start)
    return 1000 * statistics.median(spent)


def on_a_new_thread(fn: Callable[[], float], threads: int) -> float:
    """fn's result, run on a new thread with `threads` OpenMP threads."""
    box: dict[str, float] = {}

    def run():
        torch.set_num_threads(threads)
        box["out"] = fn()

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    return box["out"]


@contextlib.contextmanager
def idle_thread(call: Callable[[], None], release: bool, threads: int):
    """Within the block, another thread that ran `call` once waits, its OpenMP team kept or released."""
    ready, done = threading.Event(), threading.Event()

    def hold():
        torch.set_num_threads(threads)
        with torch.inference_mode():
            call()
        if release:
            release_team()
        ready.set()
        done.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    ready.wait()
    try:
        yield
    finally:
        done.set()
        holder.join()


def situations(call: Callable[[], None], reps: int, threads: int) -> dict[str, Callable[[], float]]:
    """{name: a function timing `call` in that situation, returning median ms}."""
    def beside(release: bool) -> float:
        with idle_thread(call, release, threads):
            return median_ms(call, reps)

    def second_thread(release_main: bool) -> float:
        median_ms(call, 2)  # the main thread's team exists
        if release_main:
            release_team()
        return on_a_new_thread(lambda: median_ms(call, reps), threads)

    return {
        "main thread alone": lambda: median_ms(call, reps),
        "main thread, an idle thread keeps its team": lambda: beside(release=False),
        "main thread, the idle thread released its team": lambda: beside(release=True),
        "second thread, the main thread's team alive": lambda: second_thread(release_main=False),
        "second thread, the main thread's team released": lambda: second_thread(release_main=True),
    }


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(prog="python -m evaluation.thread_teams", description=__doc__.splitlines()[0])
    p.add_argument("--base", default="smollm2-135m-instruct", help="target: alias, folder or Hub id")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="rounds visiting every situation in turn")
    p.add_argument("--reps", type=int, default=30, help="timed forwards per situation and round")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    target = load_causal_lm(resolve_target(args.base), getattr(torch, args.dtype), "cpu")
    runner = CompiledTarget.of(target)
    with torch.inference_mode():
        prefill_context(runner, 8)
        call = _call(runner, 1, hidden=True)
        call()  # compiles the plain step's graph
    times: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, timed in situations(call, args.reps, args.threads).items():
            times.setdefault(name, []).append(timed())
    result = {name: round(statistics.median(ms), 1) for name, ms in times.items()}
    print("| situation | ms per plain step (median of rounds) | rounds |\n|---|---:|---|")
    for name, ms in result.items():
        print(f"| {name} | {ms} | {' / '.join(f'{m:.1f}' for m in times[name])} |")
    print(json.dumps({"threads": args.threads, "dtype": args.dtype, "ms": result}))
    return result


if __name__ == "__main__":
    main()
