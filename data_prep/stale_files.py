"""Temporary files a killed writer left in a store: found, removed and logged on the next start.

Every file of a store (a shard, the manifest, a regenerated chunk) is written as `NAME.tmp-PID`
and renamed to NAME when whole (data_prep/store.py). A rank killed mid-write leaves its
`NAME.tmp-PID` behind: up to a whole shard (~11 GB for EAGLE-3) that no later run would
otherwise touch. At its start, under the store's lock and before the free-disk check, each rank
calls `remove_stale(folder, names)` for the files it is about to write (its own shards and chunks;
rank 0 also the manifest): a temporary file of one of them whose process no longer runs on this
host, or is this very process, is removed; one whose process still runs here is kept and reported.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Collection
from pathlib import Path

log = logging.getLogger("data_prep")

_TMP = re.compile(r"(?P<name>.+)\.tmp-(?P<pid>\d+)")


def remove_stale(folder: Path, names: Collection[str]) -> tuple[list[Path], list[Path]]:
    """(removed, kept): the `NAME.tmp-PID` files in `folder` with NAME in `names`, removed unless
    PID still runs on this host (and is not this process). Each is logged with its size."""
    removed, kept = [], []
    if not folder.is_dir():
        return removed, kept
    for path in sorted(folder.glob("*.tmp-*")):
        m = _TMP.fullmatch(path.name)
        if m is None or m["name"] not in names:
            continue
        pid, size = int(m["pid"]), _size(path)
        if _running(pid):
            log.warning("kept %s (%.1f MB): process %d still runs on this host and may be writing it",
                        path, size / 2**20, pid)
            kept.append(path)
            continue
        path.unlink(missing_ok=True)
        log.warning("removed %s (%.1f MB), left by process %d, which no longer runs", path, size / 2**20, pid)
        removed.append(path)
    return removed, kept


def _running(pid: int) -> bool:
    """Does process `pid` run on this host (other than this process, which writes nothing yet)?"""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
