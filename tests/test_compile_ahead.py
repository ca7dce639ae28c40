"""Shapes a conversation reaches after the model's preparation (eagle/tuning/compile_ahead.py): with
`compile_ahead` on, a forward without a graph decodes eagerly over the same cache (no compile in the
middle of a reply), and the missing graphs compile in the background between replies; greedy output
stays HF's throughout."""

import logging
import threading
import time
from types import SimpleNamespace

import torch

from eagle.decoding.settings import TreeSettings
from eagle.model import EaModel
from eagle.tuning.background import Stopped, runner_lock
from eagle.tuning.compile_ahead import START_DELAY, CompileAhead
from tests.tiny import hf_greedy, near_bigram_pair, prompt

SETTINGS = TreeSettings(total_token=4, depth=2, top_k=4, lookup=0)


def compiled_model(seed: int) -> tuple[EaModel, torch.nn.Module]:
    """A compiled model whose graphs for its tree are compiled (a short reply), with compile_ahead on."""
    target, head = near_bigram_pair(seed, coupling=0.3)
    model = EaModel(target, head, settings=SETTINGS, compile=True)
    ids = prompt(0, 7)
    assert torch.equal(model.eagenerate(ids, max_new_tokens=12), hf_greedy(target, ids, 12))
    assert model.ahead is None  # compile_ahead off: nothing deferred, nothing started
    model.compile_ahead = True
    return model, target


def reply_without_compiling(model: EaModel, ids: torch.Tensor, new: int, method: str = "eagle") -> torch.Tensor:
    """The greedy reply, checking at every token that no graph compiled in the foreground."""
    before = [r.compile_seconds for r in model.runners]
    out = []
    for tokens in model.generate(ids, max_new_tokens=new, stream=True, method=method):
        assert [r.compile_seconds for r in model.runners] == before
        out.append(tokens)
    return torch.cat([ids[0], *out])[None]


def test_replies_into_larger_cache_buckets_run_the_graphs_compiled_in_the_first():
    """Every graph serves every cache length: a conversation that outgrows its bucket compiles nothing for it."""
    model, target = compiled_model(4)
    target.config.max_position_embeddings = 1024  # the tiny target's rotary embedding has no limit of its own
    verify = set(model.compiled.shapes)
    for seed, length in ((1, 240), (2, 600)):  # 240 + 40 rows: into the 512-row bucket; 600: the 1,024-row one
        ids = prompt(seed, length)
        assert torch.equal(reply_without_compiling(model, ids, 40), hf_greedy(target, ids, 40)), seed
        assert not model.compiled.missing  # every target forward ran through the graph it had
    assert model.compiled.size == 1024 and model.drafter.compiled.size == 1024 and model.compiled.shapes == verify


def test_a_shape_without_a_graph_decodes_eagerly_then_compiles_in_the_background():
    model, target = compiled_model(5)
    ids = prompt(3, 20)  # plain decoding: its one-row step has no graph yet
    assert torch.equal(reply_without_compiling(model, ids, 20, "naive"), hf_greedy(target, ids, 20))
    assert model.compiled.missing == {(1, False)} and model.ahead is not None
    assert model.ahead.done.wait(600) and model.ahead.error is None
    assert not model.compiled.missing and (1, False) in model.compiled.shapes
    again = prompt(4, 260)
    assert torch.equal(reply_without_compiling(model, again, 20, "naive"), hf_greedy(target, again, 20))
    assert not model.compiled.missing


def test_a_reply_while_a_graph_compiles_waits_for_it_then_decodes_through_the_graphs(caplog):
    model, target = compiled_model(6)
    held = threading.Event()

    def compiling():  # the background thread, holding the runners while it compiles a graph
        with runner_lock(target):
            held.set()
            time.sleep(1.5)

    worker = threading.Thread(target=compiling, daemon=True)
    worker.start()
    assert held.wait(10)
    threads, seen, ids, out = torch.get_num_threads(), [], prompt(5, 9), []
    start = time.perf_counter()
    with caplog.at_level(logging.INFO, logger="eagle"):
        for tokens in model.ea_generate(ids, max_new_tokens=16):
            seen.append((torch.get_num_threads(), model.runner is model.compiled))
            out.append(tokens)
    waited = time.perf_counter() - start
    worker.join()
    assert torch.equal(torch.cat([ids[0], *out])[None], hf_greedy(target, ids, 16))
    assert set(seen) == {(threads, True)} and waited >= 1.0
    assert "a graph is compiling in the background: this reply starts when it is done" in caplog.messages


class CountingRunner:
    """A runner with one pending shape, recording what it is asked to compile."""

    def __init__(self):
        self.prepared: list[tuple] = []

    def pending(self) -> list[tuple]:
        return [shape for shape in [(1, False)] if shape not in self.prepared]

    def prepare(self, shape: tuple) -> None:
        self.prepared.append(shape)


def test_compiling_ahead_starts_after_a_moment_so_an_exit_right_after_a_reply_compiles_nothing():
    runner = CountingRunner()
    model = SimpleNamespace(target=torch.nn.Linear(1, 1), runners=[runner])
    start = time.perf_counter()
    work = CompileAhead(model).start()
    work.stop()  # what the exit hook does
    assert time.perf_counter() - start < START_DELAY and isinstance(work.error, Stopped) and not runner.prepared
    work = CompileAhead(model).start()
    assert work.done.wait(START_DELAY + 10) and work.error is None
    assert runner.prepared == [(1, False)] and work.compiled == 1
