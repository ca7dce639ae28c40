"""Write shards on a background thread while the caller computes the next one.

    with ShardWriter(on_written, background=True) as writer:
        for k in shards:
            shard = compute(k)                          # the target's forward fills shard k
            writer.submit(k, path_k, write_shard, shard, ...)   # returns once shard k-1 is on disk

One shard is written at a time, and at most one more waits in memory: `submit` first waits for
the previous write, hands its result to `on_written(k, result)` in the calling thread (which
records it in the manifest), then starts the new one and returns, so the next forward overlaps
this write. An error of a write is raised in the calling thread at the next `submit` or at the end,
naming the shard's file. If the caller's block fails, the write in flight is still waited for and
handed over when it succeeds: a shard that reached the disk is never left out of the manifest.
With `background=False` each write runs in the calling thread, in order. After each write the
writer's thread ends its OpenMP workers (eagle/common/openmp_team.py): kept alive beside the
caller's forwards, they made both threads' parallel loops wait for a wake-up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from eagle.common.openmp_team import release_team

log = logging.getLogger("data_prep")


class ShardWriter:
    def __init__(self, on_written: Callable[[int, dict], None], background: bool = True):
        self.on_written = on_written
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-writer") if background else None
        self._pending: tuple[int, Path, Future] | None = None

    def submit(self, k: int, path: Path, write: Callable[..., dict], *args) -> None:
        """Write shard k to `path` with `write(path, *args)`, after the previous write is done."""
        self._collect()
        if self._pool is None:
            self.on_written(k, _named(path, lambda: write(path, *args)))
            return
        self._pending = (k, path, self._pool.submit(_releasing_team, write, path, *args))

    def _collect(self) -> None:
        """Wait for the write in flight (if any) and hand its result over; raise its error."""
        if self._pending is None:
            return
        k, path, future = self._pending
        self._pending = None
        self.on_written(k, _named(path, future.result))

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if exc is None:
                self._collect()
            else:
                try:
                    self._collect()  # keep a shard that reached the disk before the caller failed
                except BaseException as late:  # the caller's error is the one to report
                    log.warning("the write in flight failed too: %s", late)
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
        return False


def _releasing_team(write: Callable[..., dict], path: Path, *args) -> dict:
    """write(path, *args), then this thread's OpenMP workers end."""
    try:
        return write(path, *args)
    finally:
        release_team()


def _named(path: Path, result: Callable[[], dict]) -> dict:
    """result(), with an error that does not name `path` raised again with its name."""
    try:
        return result()
    except Exception as e:
        if path.name in str(e):
            raise
        if isinstance(e, OSError):
            raise OSError(e.errno, f"{path}: {e.strerror or e}") from e
        raise RuntimeError(f"{path}: {type(e).__name__}: {e}") from e
