"""How much of the machine other work took while something was timed: `OthersShare`.

A tree budget timed while another job ran (a test suite, a second decoder, a build) prices every
forward by that job's load, and a stored pick would be reused by every later process on a quiet
machine: a pick timed beside three vLLM engines ran plain decoding at ~50 ms a token where the
same graph runs at 27-31 ms quiet (docs/speed.md). So the tuner measures the CPU time other
processes took during its timing and stores the pick only when they left the machine mostly alone.

"Others" are all processes but this one and its descendants (inductor's compile workers). Linux
only (/proc); elsewhere the share is unknown (None) and picks are stored as before.

    with OthersShare() as load:
        budget = tune_tree(model)
    load.share      # 0.0-1.0 of all CPUs' time, or None
"""

from __future__ import annotations

import os
from pathlib import Path

from eagle.common.child_process import process_stats, process_tree

BUSY = 0.25  # others' share of the machine above which a timing is not trusted for later processes
PROC = Path("/proc")


class OthersShare:
    """Context manager: `share` is the fraction of all CPUs' time that other processes used inside it."""

    def __init__(self):
        self.share: float | None = None
        self._start: tuple[int, int, int] | None = None

    def __enter__(self) -> OthersShare:
        self._start = _snapshot()
        return self

    def __exit__(self, *exc) -> None:
        end = _snapshot()
        if self._start is None or end is None:
            return
        total, busy, ours = (b - a for a, b in zip(self._start, end, strict=True))
        self.share = max(0.0, (busy - ours) / total) if total > 0 else 0.0

    @property
    def busy(self) -> bool:
        return self.share is not None and self.share > BUSY


def _snapshot() -> tuple[int, int, int] | None:
    """(all CPUs' jiffies, their busy jiffies, busy jiffies of this process tree), or None without /proc."""
    try:
        fields = [int(v) for v in (PROC / "stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    return sum(fields), user + nice + system + irq + softirq, _tree_jiffies(os.getpid())


def _tree_jiffies(root: int) -> int:
    """CPU time of `root` and every process descended from it: their threads, and their children that
    ended and were waited for (utime, stime, cutime, cstime)."""
    stats = process_stats(PROC)
    return sum(sum(int(v) for v in stats[p][11:15]) for p in process_tree(root, stats) if p in stats)
