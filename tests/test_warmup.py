"""Background preparation (eagle/tuning/warmup.py): a model built with `from_modules` /
`from_pretrained` decodes at once, eagerly and losslessly, while a thread tunes and compiles; it
takes over the tuned settings and the compiled runners at its next generation."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import torch

import eagle.model
from eagle.compiled.target_graphs import ANY_ROWS
from eagle.decoding.settings import TreeSettings
from eagle.model import EaModel
from eagle.tuning.background import runner_lock
from eagle.tuning.warmup import PROVISIONAL, Warmup
from tests.tiny import hf_greedy, near_bigram_pair, prompt


@pytest.fixture
def quick_tuner(monkeypatch, tmp_path):
    """A tuner of 2 steps and 1 round, counted; picks cached under tmp_path."""
    monkeypatch.setenv("EAGLE_CACHE", str(tmp_path))
    calls = []
    real = eagle.model.tune_tree

    def quick(model, prompts=None, sizes=None, **options):
        calls.append(options.get("pause"))
        return real(model, prompts, sizes, positions_per_prompt=2, repeats=1, **options)

    monkeypatch.setattr(eagle.model, "tune_tree", quick)
    return calls


def test_auto_decodes_at_once_eagerly_then_takes_over_the_tuned_pick(quick_tuner, tmp_path):
    target, head = near_bigram_pair(3)
    model = EaModel.from_modules(target, head, settings=TreeSettings(top_k=4))
    assert model.warmup is not None
    assert (model.settings.total_token, model.settings.depth) == PROVISIONAL
    ids = prompt(4, 9)
    assert torch.equal(model.eagenerate(ids, max_new_tokens=24), hf_greedy(target, ids, 24))  # while tuning
    assert model.wait_ready(timeout=300)
    assert model.warmup is None and model.tuning is not None
    assert (model.settings.total_token, model.settings.depth) == (model.tuning.total_token, model.tuning.depth)
    assert quick_tuner and quick_tuner[0] is not None  # the background tuner was given its pause
    assert len(list((tmp_path / "tree-budgets").glob("*.json"))) == 1
    assert torch.equal(model.eagenerate(ids, max_new_tokens=24), hf_greedy(target, ids, 24))
    again = EaModel.from_modules(target, head, settings=TreeSettings(top_k=4))
    assert again.warmup is None and again.settings == model.settings  # the cached pick, eager: nothing to do
    assert len(quick_tuner) == 1


def test_compiled_model_decodes_eagerly_until_its_graphs_are_compiled(quick_tuner):
    target, head = near_bigram_pair(5, coupling=0.3)
    model = EaModel.from_modules(target, head, settings=TreeSettings(total_token=4, depth=2, top_k=4, lookup=0),
                                 compile=True)
    assert model.runner is model.eager and model.drafter.runner is model.drafter.eager
    ids = prompt(8, 7)
    assert torch.equal(model.eagenerate(ids, max_new_tokens=20), hf_greedy(target, ids, 20))
    assert model.wait_ready(timeout=600)
    assert model.runner is model.compiled and model.drafter.runner is model.drafter.compiled
    assert {rows for rows, hidden in model.compiled.shapes if hidden} == {ANY_ROWS}  # the verify graph, compiled
    width = model.drafter.feature_width
    commits = {rows for _, rows, w, scored in model.drafter.compiled.shapes if (w, scored) == (width, 1)}
    assert commits >= {1, 2, 4}  # a commit of every accepted length depth 2 allows (3 tokens, padded to 4)
    assert not quick_tuner  # a numeric budget: nothing to tune
    assert torch.equal(model.eagenerate(ids, max_new_tokens=20), hf_greedy(target, ids, 20))


def test_a_generation_takes_over_a_finished_warmup_at_its_start(quick_tuner):
    target, head = near_bigram_pair(6)
    model = EaModel.from_modules(target, head, settings=TreeSettings(top_k=4))
    model.warmup.done.wait(300)
    assert model.warmup is not None  # finished, not yet taken over
    ids = prompt(2, 6)
    model.eagenerate(ids, max_new_tokens=4)
    assert model.warmup is None and model.settings.total_token == model.tuning.total_token


def test_the_tuner_waits_while_the_model_generates():
    """`pause` blocks while the foreground model is generating and returns once it is idle."""
    work = Warmup(view=None, tune=False)
    work.idle.clear()
    passed = threading.Event()
    waiter = threading.Thread(target=lambda: (work.pause(), passed.set()), daemon=True)
    waiter.start()
    time.sleep(0.2)
    assert not passed.is_set()
    work.idle.set()
    assert passed.wait(5)


def test_generation_marks_the_model_busy_while_it_prepares(quick_tuner):
    target, head = near_bigram_pair(7)
    model = EaModel.from_modules(target, head, settings=TreeSettings(top_k=4))
    seen = []
    stream = model.ea_generate(prompt(1, 5), max_new_tokens=6)
    next(stream)
    seen.append(model.warmup.idle.is_set() if model.warmup is not None else None)
    list(stream)
    assert seen in ([False], [None])  # busy during the generation (None: it had already finished)
    if model.warmup is not None:
        assert model.warmup.idle.is_set()
    model.wait_ready(300)


def test_a_failed_preparation_leaves_the_model_eager_and_says_why(quick_tuner, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(eagle.model, "tune_tree", broken)
    target, head = near_bigram_pair(8)
    with caplog.at_level(logging.WARNING, logger="eagle"):
        model = EaModel.from_modules(target, head, settings=TreeSettings(top_k=4))
        assert model.wait_ready(timeout=60)
    assert "background preparation failed" in caplog.text and "no compiler here" in caplog.text
    assert (model.settings.total_token, model.settings.depth) == PROVISIONAL and model.runner is model.eager
    ids = prompt(3, 5)
    assert torch.equal(model.eagenerate(ids, max_new_tokens=12), hf_greedy(target, ids, 12))


def test_warmups_of_models_sharing_a_target_hold_one_lock(quick_tuner):
    target, head = near_bigram_pair(9)
    lock = runner_lock(target)
    with lock:  # another warm-up of this target's compiled runners is under way
        model = EaModel.from_modules(target, head, settings=TreeSettings(top_k=4))
        time.sleep(0.3)
        assert not model.warmup.done.is_set()  # waits for the lock
    assert model.wait_ready(timeout=300)


def test_a_generation_beside_a_running_compile_decodes_on_one_thread(quick_tuner):
    target, head = near_bigram_pair(11)
    model = EaModel.from_modules(target, head, settings=TreeSettings(top_k=4))
    model.warmup.working = True  # as between two pauses of the thread
    before, seen = torch.get_num_threads(), []
    stream = model.ea_generate(prompt(2, 5), max_new_tokens=4)
    next(stream)
    seen.append(torch.get_num_threads())
    list(stream)
    assert seen == [1] and torch.get_num_threads() == before
    model.wait_ready(300)


def test_exit_stops_the_background_work_at_its_next_pause(quick_tuner):
    """At exit the thread ends at a pause instead of being torn down inside a compile (which aborts)."""
    target, head = near_bigram_pair(12)
    model = EaModel.from_modules(target, head, settings=TreeSettings(top_k=4))
    warmup = model.warmup
    warmup.stop()
    assert not warmup.thread.is_alive() and warmup.done.is_set()
    assert model.wait_ready(1) and model.runner is model.eager  # stopped: stays eager, provisional budget
    assert (model.settings.total_token, model.settings.depth) == PROVISIONAL


def test_a_chat_piped_one_question_exits_cleanly_while_its_model_prepares(tiny_dir, tmp_path):
    """`echo ... | python -m eagle.chat`, compiled and tuning by default, ends with status 0 right after
    its reply (a thread torn down inside a compile aborted the interpreter with status 134)."""
    import subprocess
    import sys

    from tests.tiny import ROOT, clean_env

    out = subprocess.run([sys.executable, "-m", "eagle.chat", "--target", str(tiny_dir), "--random-head", "--dtype",
                          "float32", "--max-new-tokens", "4"], input="Hi\n", capture_output=True, text=True,
                         timeout=300, cwd=ROOT, env=clean_env(EAGLE_CACHE=str(tmp_path), EAGLE_COMPILE="1"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "[tau" in out.stderr and "in the background" in out.stderr


def test_the_background_thread_may_compile_a_graph_per_shape(quick_tuner):
    """Dynamo's config is per thread (a new one starts at recompile_limit 8): the warm-up raises its own."""
    import torch._dynamo

    seen = []
    real = eagle.model.tune_tree

    def spy(model, *args, **kwargs):
        seen.append(torch._dynamo.config.recompile_limit)
        return real(model, *args, **kwargs)

    eagle.model.tune_tree = spy
    try:
        target, head = near_bigram_pair(14)
        assert EaModel.from_modules(target, head, settings=TreeSettings(top_k=4)).wait_ready(300)
    finally:
        eagle.model.tune_tree = real
    assert seen and seen[0] >= 64


def test_background_work_runs_at_its_creators_thread_count_whatever_the_process_count_at_its_start():
    """A thread takes torch's process-wide thread count at its first op, and a reply beside background work sets
    it to 1 for a while (`reply_beside_work`): the work's graphs compiled at 1 thread could not be run by the
    model's thread (graph_cache.threads_match). The work sets its creator's count first."""
    from eagle.tuning.background import BackgroundWork

    class Probe(BackgroundWork):
        def _work(self):
            self.seen = torch.get_num_threads()

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        work = Probe()
        torch.set_num_threads(1)  # as inside a reply on one thread, when the work's thread starts
        work.start().done.wait(60)
        assert work.error is None and work.seen == 2
    finally:
        torch.set_num_threads(threads)
