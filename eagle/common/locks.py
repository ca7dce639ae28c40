"""One writer per folder: a store (data_prep) or a run (train) is written by one job at a time.

`exclusive(folder, what)` holds an advisory lock on `folder/.lock` (fcntl.flock) while the block
runs; a second job on the same folder stops at once with one line naming the holder's pid.
The operating system drops the lock when its process dies, even by SIGKILL, so there are no
stale locks to clean up. Only rank 0 of a multi-process job takes it; the other ranks follow
rank 0 (eagle/common/distributed.py). `in_turn(path)` is the waiting kind: the block runs once
no other process holds the lock on `path` (one build of a C++ extension at a time:
eagle/common/native_build.py).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK = ".lock"


class Busy(RuntimeError):
    """Another process holds the folder's lock."""


@contextmanager
def exclusive(folder: str | Path, what: str, take: bool = True) -> Iterator[None]:
    """Hold folder/.lock for the block (`take=False`: a no-op, for ranks other than 0)."""
    if not take:
        yield
        return
    folder = Path(folder)
    fd = _opened(folder / LOCK)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise Busy(f"{folder}: another {what} (pid {holder}) is writing this {what.split()[-1]} folder; "
                       f"wait for it, or choose another folder") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the lock


@contextmanager
def in_turn(path: str | Path) -> Iterator[None]:
    """Hold an advisory lock on the file `path` for the block, after whichever process holds it now."""
    fd = _opened(Path(path))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _opened(path: Path) -> int:
    """A descriptor of the lock file `path` (created with its folder when missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
