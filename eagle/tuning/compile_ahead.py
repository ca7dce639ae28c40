"""Graphs a conversation reaches after the model's preparation, compiled between replies: `CompileAhead`.

Once its background preparation is taken over (eagle/tuning/warmup.py), a model decodes with
`compile_ahead` on: a forward whose shape has no graph yet (a head width or a plain step the
preparation did not decode; every graph serves every cache length) runs eagerly over the same cache
instead of compiling in the middle of a reply (~20 s to minutes a graph), and its runner notes the
shape (`missing`). When a generation ends, the shapes the runners missed (`pending`) compile in a
daemon thread, one graph at a time while the model is idle. A generation that starts while a graph
compiles waits for it (an eager forward may not run beside a compile: eagle/common/forward_lock.py),
then decodes through the graphs.

    with compiled_generation(model):   # eagle/tuning/warmup.py generation(), compiled runners
        ...                             # the reply; then the pending shapes compile in the background
"""

from __future__ import annotations

import contextlib
import logging

from eagle.common.forward_lock import WAIT_SAID
from eagle.tuning.background import BackgroundWork, runner_lock

log = logging.getLogger("eagle")
START_DELAY = 2.0  # seconds after a reply before the first graph compiles (a piped question exits first)


class CompileAhead(BackgroundWork):
    """Compiles the model's runners' pending shapes, one per pause, holding the runners' lock."""

    failure = "compiling ahead failed; shapes without a graph keep decoding eagerly"

    def __init__(self, model):
        super().__init__()
        self.target, self.runners = model.target, list(model.runners)
        self.compiled = 0

    def _work(self) -> None:
        self.generated.wait(START_DELAY)  # `stop` sets it: a process exiting after its reply ends here
        while True:
            self.pause()
            with runner_lock(self.target):
                todo = [(runner, shape) for runner in self.runners for shape in runner.pending()]
                if not todo:
                    break
                runner, shape = todo[0]
                runner.prepare(shape)
                self.compiled += 1
        log.info("compiled %d more graph(s) of the decoder in the background", self.compiled)


@contextlib.contextmanager
def compiled_generation(model):
    """Around a generation through the compiled runners: holds their lock (waiting for a graph the
    background is compiling, said when it takes a while) and defers shapes without a graph
    (`compile_ahead`). Afterwards starts compiling the pending shapes, if any."""
    ahead = model.ahead if model.ahead is not None and not model.ahead.done.is_set() else None
    if ahead is not None:
        ahead.idle.clear()  # its next graph waits for the end of this reply
    lock = runner_lock(model.target)
    if not lock.acquire(timeout=WAIT_SAID):
        log.info("a graph is compiling in the background: this reply starts when it is done")
        lock.acquire()
    try:
        for runner in model.runners:
            runner.defer = model.compile_ahead
        yield
    finally:
        lock.release()
        if ahead is not None:
            ahead.resume()
    if model.compile_ahead:
        start_if_pending(model)


def start_if_pending(model) -> None:
    """Start compiling the runners' pending shapes in the background, unless that work is under way or
    has failed before."""
    if model.ahead is not None and (not model.ahead.done.is_set() or model.ahead.error is not None):
        return
    with runner_lock(model.target):
        pending = sum(len(runner.pending()) for runner in model.runners)
    if pending:
        log.info("compiling %d graph(s) the last reply ran without in the background", pending)
        model.ahead = CompileAhead(model).start()
