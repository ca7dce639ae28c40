"""Work that runs beside the foreground decoding, in a daemon thread, only while the model is idle.

    work = SomeWork(...).start()      # a `BackgroundWork` subclass: its `_work` runs in the thread
    work.idle.clear() ... work.resume()     # the model says when it generates; `_work` calls `pause()`
    work.done.wait(); work.error      # None, or why it ended early

Only one thread's OpenMP team lives at a time (eagle/common/openmp_team.py): the work releases its
team before it waits for the model, and the model releases its own when it hands over (`start`,
`resume`); two teams on a 2-core machine made both threads' compiled forwards ~2x slower.

Two kinds: the first preparation of a model (eagle/tuning/warmup.py: tune, then compile) and the
graphs a conversation reaches later (eagle/tuning/compile_ahead.py). Both hold `runner_lock` while
they use a target's compiled runners, which keep one KV cache per target.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import sys
import threading
import time
import weakref

import torch
from torch import nn

from eagle.common.openmp_team import release_team
from eagle.compiled.target_graphs import allow_a_graph_per_shape

log = logging.getLogger("eagle")
_LOCKS: weakref.WeakKeyDictionary[nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def runner_lock(target: nn.Module) -> threading.RLock:
    """The lock of a target's compiled runners: held by background work while it uses them and by each
    generation that decodes through them (re-entrant: a warm-up's own calibration decoding takes it again)."""
    with _LOCKS_GUARD:
        if target not in _LOCKS:
            _LOCKS[target] = threading.RLock()
        return _LOCKS[target]


SWITCH_INTERVAL = 2e-4  # seconds: how long a thread holding the GIL keeps it while another waits for it


@contextlib.contextmanager
def reply_beside_work(one_thread: bool):
    """Around a reply that decodes beside background work: the GIL changes hands every 0.2 ms instead of 5,
    and with one_thread (the work is compiling or timing now) torch runs this thread's ops on one core.

    Each torch op of the reply releases the GIL and waits a whole switch interval to get it back from the
    compiling thread, which runs Python (tracing, lowering) nonstop; a forward has hundreds of ops. OpenMP
    workers waiting for a core the compiler holds made eager decoding ~10x slower."""
    interval, threads = sys.getswitchinterval(), torch.get_num_threads()
    sys.setswitchinterval(min(interval, SWITCH_INTERVAL))
    if one_thread:
        torch.set_num_threads(1)  # this thread's count, and the one a thread starts with (BackgroundWork sets its own)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)
        torch.set_num_threads(threads)


class Stopped(Exception):
    """The process is exiting: the work ends where it is."""


class BackgroundWork:
    """A daemon thread running `_work`, which calls `pause()` before each part that must not run beside a
    generation; `done` is set when it ends (`error`: None, or why it ended early)."""

    failure = "background work failed"  # the warning's start when `_work` raises

    def __init__(self):
        self.idle = threading.Event()  # set while the foreground model is not generating
        self.idle.set()
        self.generated = threading.Event()  # set when the model's first generation ends
        self.working = False  # True while the thread compiles or times (between two `pause` calls)
        self.stopping = False  # set at exit: the thread ends at its next pause
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.threads = torch.get_num_threads()  # the creator's: the thread's graphs and timings run at it
        self.thread = threading.Thread(target=self._run, name=f"eagle-{type(self).__name__.lower()}", daemon=True)

    def start(self):
        release_team()  # the caller's OpenMP workers would slow the thread's forwards (module docstring)
        self.thread.start()
        atexit.register(self.stop)
        return self

    def stop(self) -> None:
        """End the thread at its next pause and wait for it (at exit: a thread torn down inside a compile
        aborts the interpreter). A graph being compiled is finished first."""
        if not self.thread.is_alive():
            return
        if self.working:
            log.info("stopping the background work (after the graph it is compiling)")
        self.stopping = True
        self.idle.set()
        self.generated.set()
        self.thread.join()

    def resume(self) -> None:
        """The foreground model's generation has ended: the work may go on, and has the cores (the calling
        thread's OpenMP workers end)."""
        release_team()
        self.idle.set()

    def pause(self) -> None:
        """Wait until the foreground model is not generating: compiling beside a generation would slow it
        several-fold, and timing beside one would measure both. While it waits, this thread holds no OpenMP
        workers (they would make the generation's own sleep between its parallel regions)."""
        self.working = False
        if not self.idle.is_set():
            release_team()
            self.idle.wait()
        if self.stopping:
            raise Stopped
        torch.set_num_threads(self.threads)  # the model's count (see `_run`), whatever changed it meanwhile
        self.working = True

    def _work(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        start = time.perf_counter()
        try:
            # A thread takes torch's process-wide count at its first op: 1 if that falls inside a reply's
            # `reply_beside_work(one_thread=True)`. Graphs compiled at another count than the model's are
            # slower, and its calls from the model's thread could not run them (graph_cache.threads_match).
            torch.set_num_threads(self.threads)
            allow_a_graph_per_shape()  # dynamo's config is per thread
            with torch.inference_mode():
                self._work()
        except Stopped:
            self.error = Stopped()
        except Exception as e:  # noqa: BLE001 - any failure leaves the model decoding as before; the user is told why
            self.error = e
            log.warning("%s: %s: %s", self.failure, type(e).__name__, e)
        finally:
            self.seconds = time.perf_counter() - start
            self.working = False
            atexit.unregister(self.stop)  # the exit hook would keep the model alive
            self.done.set()
