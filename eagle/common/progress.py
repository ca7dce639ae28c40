"""What the decoder is doing while it prepares: one line per phase on stderr.

    progress.show(quiet=False)                     # the "eagle" logger's INFO lines go to stderr
    with progress.phase("loading the target"):     # "[eagle] loading the target ... 2.1 s"
        ...

`show` adds a handler only when the program has configured no logging of its own (then its
configuration decides), and `EAGLE_QUIET=1` silences it as `quiet=True` does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time

log = logging.getLogger("eagle")
_HANDLER_NAME = "eagle-progress"


def show(quiet: bool = False) -> None:
    """Print the "eagle" logger's INFO lines on stderr, unless quiet, EAGLE_QUIET=1 or the program logs itself."""
    if quiet or os.environ.get("EAGLE_QUIET") == "1":
        return
    if log.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.name = _HANDLER_NAME
    handler.setFormatter(logging.Formatter("[eagle] %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)


@contextlib.contextmanager
def phase(message: str, *args: object):
    """Log `message` with how many seconds the block took, when it ends (INFO on the "eagle" logger)."""
    start = time.perf_counter()
    yield
    log.info(message + " (%.1f s)", *args, time.perf_counter() - start)
