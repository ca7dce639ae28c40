"""Forwards of our models never overlap across threads, nor run beside a compile: `one_forward()`
around each target forward, compiled or eager, each eager head forward, and each compile of ours
(eagle/compiled/graph_cache.py).

    with one_forward():               # the target runners' every forward, compiles included
        out = compiled(...)
    out = eager_forward(target, ...)  # the same, for an eager call

Transformers collects a forward's hidden states through module hooks that look up the collector in a
context variable, except while a compiled forward runs or dynamo traces one: then the collector is
one attribute for the whole process (`transformers.utils.output_capturing.CompileableContextVar`).
An eager forward in one thread while another thread's compiled forward of the same model ran (the
background preparation decoding its calibration prompt beside a reply) wrote its hidden states into
the other forward's list and came back with too few (an IndexError in the decoder); a graph traced
meanwhile could see the attribute set and fail its guards at its next call. And inductor's passes
trace with `torch.fx`, which patches `nn.Module.__call__` for the whole process while it traces: an
eager forward (of the target or the head) beside another thread's compile went through the tracer
("module is not installed as a submodule"). So forwards and compiles take one process-wide lock:
uncontended, well under a microsecond a forward. A compile holds it throughout (a reply beside one
waits for it, and says so): releasing it while inductor lowers the graph would invert the order
against dynamo's own compile lock.
"""

from __future__ import annotations

import contextlib
import logging
import threading

log = logging.getLogger("eagle")
_LOCK = threading.RLock()
WAIT_SAID = 0.5  # seconds of waiting after which the wait is logged (a compile, not another forward)


@contextlib.contextmanager
def one_forward():
    """Around a forward or a compile: no other thread's forward or compile runs meanwhile."""
    if not _LOCK.acquire(timeout=WAIT_SAID):
        log.info("waiting for the graph compiling in the background (one forward of the target at a time)")
        _LOCK.acquire()
    try:
        yield
    finally:
        _LOCK.release()


def eager_forward(module, **kwargs):
    """module(**kwargs) under `one_forward`."""
    with one_forward():
        return module(**kwargs)
