"""Reaching the tuned, compiled speed without making anyone wait: `Warmup`.

`EaModel.from_pretrained` and `EaModel.from_modules` return once the weights are loaded. Until the
model is ready it decodes through its eager runners (nothing to compile) with the tree budget
cached for this machine, or `PROVISIONAL` when there is none. Meanwhile one background thread
works on a second view of the model that drives the compiled runners (`EaModel.view`):

1. **tune** `total_token="auto"` when no pick is cached (eagle/tuning/tuner.py). Its timed parts
   run only while the model is not generating (`pause`), so the foreground decoding does not
   distort them; the pick is cached for the next process (eagle/tuning/budget_cache.py);
2. **compile** the chosen budget's graphs by decoding a calibration prompt (the tuner has
   compiled most of them already), and the head's commit graphs of every accepted length.

The model takes over the result at the start of its next generation (`EaModel.wait_ready()` at
once). A failure in the thread leaves the model eager, with a warning. Background work on models
that share a target runs one at a time, and a generation uses the compiled runners only while no
warm-up holds them (`runner_lock`): compiled runners keep one KV cache per target.

    warmup = Warmup(view, tune=True)        # EaModel starts it
    warmup.idle.clear() ... warmup.resume()     # the model says when it generates
    warmup.done.wait(); warmup.view.settings  # the tuned settings
"""

from __future__ import annotations

import contextlib
import logging

from eagle.tuning.background import BackgroundWork, reply_beside_work, runner_lock
from eagle.tuning.compile_ahead import compiled_generation
from eagle.tuning.tuner import calibration_prompts

log = logging.getLogger("eagle")
# (total_token, depth) decoded with, eagerly, until a pick is tuned (wide eager verifies cost more)
PROVISIONAL = (4, 1)
FIRST_WAIT = 3.0  # seconds the background work waits for a first generation to begin (and then to end)
COMPILE_TOKENS = 24  # new tokens of the calibration decoding that compiles the chosen shapes


def prepare_in_background(model, tune: bool):
    """Start the model's `Warmup` (tune when asked, compile when the model compiles) and decode eagerly
    until it ends; returns the model. Nothing to do: the model as it is."""
    if not tune and model.compiled is None:
        return model
    view = model.view()  # its settings: the tuner's largest budget, or the budget to compile
    if tune:
        model.settings = model.settings.tuned(*PROVISIONAL)
    model.use_runners(compiled=False)
    model.warmup = Warmup(view, tune).start()
    work = "tuning the draft tree for this machine and compiling" if tune else "compiling"
    log.info("decoding eagerly with %s while %s in the background (%s)", model.settings.describe(), work,
             "minutes, once per machine and head" if tune else "seconds to minutes, once per process")
    return model


def adopt(model) -> None:
    """Take over a finished warm-up: its settings and tuning, and the compiled runners (unless it failed)."""
    warmup, model.warmup = model.warmup, None
    if warmup.error is not None:
        return
    model.settings, model.tuning = warmup.view.settings, warmup.view.tuning
    model.use_runners(compiled=True)
    model.compile_ahead = True  # shapes reached later compile between replies (eagle/tuning/compile_ahead.py)
    log.info("ready after %.0f s of background preparation: %s%s", warmup.seconds, model.settings.describe(),
             ", compiled forwards" if model.compiled is not None else "")


@contextlib.contextmanager
def generation(model):
    """Around one generation: take over a finished warm-up; while one runs, mark the model busy (its
    next compile or timing waits) and decode on one thread if it is in the middle of one (OpenMP threads
    waiting for a core the compiler holds made eager decoding ~10x slower); decoding through compiled
    runners holds their lock (eagle/tuning/compile_ahead.py)."""
    if model.warmup is not None and model.warmup.done.is_set():
        adopt(model)
    warmup = model.warmup
    if warmup is not None:
        warmup.idle.clear()
        try:  # one thread while a compile (C++ compilers on every core) or a timing is under way
            with reply_beside_work(one_thread=warmup.working):
                yield
        finally:
            warmup.resume()
            warmup.generated.set()
    elif model.runner is model.compiled and model.compiled is not None:
        with compiled_generation(model):
            yield
    else:
        yield


class Warmup(BackgroundWork):
    """Tunes (when asked) and compiles a model view in a daemon thread; `done` is set when it ends."""

    failure = "background preparation failed, decoding stays eager"

    def __init__(self, view, tune: bool):
        super().__init__()
        self.view, self.tune = view, tune

    def _work(self) -> None:
        self.generated.wait(FIRST_WAIT)  # a reply asked for at once runs alone
        self.pause()
        with runner_lock(self.view.target):
            if self.tune:
                self.view.tune(pause=self.pause)
            if self.view.compiled is not None:
                self._compile()

    def _compile(self) -> None:
        """Decode one calibration prompt with the chosen settings: compiles the graphs they use, a step at
        a time while the model is idle."""
        view = self.view
        ids = calibration_prompts(view)[0].to(view.target.get_input_embeddings().weight.device)
        method = "naive" if view.plain_decoding else "eagle"
        before = sum(r.compile_seconds for r in view.runners)
        for _ in view.generate(ids, max_new_tokens=COMPILE_TOKENS, method=method, stream=True):
            self.pause()  # a step at a time: the foreground's generations go first
        self._compile_commits()
        log.info("compiled the decoder's graphs for %s in %.0f s (in the background)",
                 view.settings.describe(), sum(r.compile_seconds for r in view.runners) - before)

    def _compile_commits(self) -> None:
        """The head's graphs for a commit of every accepted length the settings allow (up to max(depth, lookup) + 1
        tokens): the calibration decoding meets only some, and a reply that met another would make the next reply
        wait for its compile (eagle/tuning/compile_ahead.py)."""
        view, runner = self.view, self.view.drafter.compiled
        if runner is None or view.plain_decoding:
            return
        most = max(view.settings.depth, view.settings.lookup) + 1
        for shape in runner.commit_shapes(most, view.drafter.feature_width):
            if shape not in runner.shapes:
                self.pause()
                runner.prepare(shape)
