"""Shared test fixtures (helpers: tests/tiny.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from data_prep.resolvers import register_resolvers
from tests.tiny import embedded_target_or_skip, tiny_llama

register_resolvers()  # for the tests that compose the Hydra config, as the entry points do
# Every test decodes eagerly unless it passes compile=True (tests/test_compiled.py, the bench test): a
# compile costs seconds per shape even for a tiny model, and most tests build several decoders.
os.environ["EAGLE_COMPILE"] = "0"
# A test that compiles takes ATen's matmuls: the C++ GEMM template generates and builds a kernel per
# matmul (eagle/compiled/graph_cache.py); tests/test_graph_cache.py turns it back on to check it.
os.environ["EAGLE_MATMULS"] = "aten"
# ... and calls its kernels from Python: the C++ wrapper (the decoder's default, eagle/compiled/graph_cache.py)
# compiles a tiny model's graphs 1.5-2.5x slower; the tests that check it set EAGLE_CPP_WRAPPER=1.
os.environ["EAGLE_CPP_WRAPPER"] = "0"
# ... and drafts with exact head weights, so compiled and eager drafts agree: on AVX2 CPUs the decoder's default
# reads them as int8 (eagle/compiled/gemv.py `int8_drafts`); tests/test_gemv.py sets EAGLE_DRAFT_INT8=auto to check it.
os.environ["EAGLE_DRAFT_INT8"] = "0"


@pytest.fixture(autouse=True)
def _single_thread():
    """Tests use tiny models, which run fastest on one thread; on a shared CPU two threads
    were measured 10-40x slower than one (oversubscription)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _own_budget_cache(tmp_path_factory, monkeypatch):
    """Budgets a test tunes (`total_token="auto"`) go to the test run's temporary folder, never to the
    user's ~/.cache; a test that points EAGLE_CACHE somewhere keeps that."""
    from eagle.tuning import budget_cache

    default = tmp_path_factory.getbasetemp() / "eagle-cache"
    monkeypatch.setattr(budget_cache, "cache_dir", lambda: Path(os.environ.get("EAGLE_CACHE") or default))


@pytest.fixture
def tiny_target():
    return tiny_llama()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama saved as a HF folder with the embedded default's ChatML tokenizer."""
    from eagle.targets.tokenizer import load_tokenizer

    embedded = embedded_target_or_skip()
    out = tmp_path_factory.mktemp("tiny_target")
    tok = load_tokenizer(embedded)
    model = tiny_llama(seed=3, vocab_size=len(tok), hidden_size=64)
    model.config.eos_token_id = tok.eos_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(autouse=True)
def _picks_always_cached(monkeypatch):
    """Tuned picks are cached whatever else runs on the machine (a test that checks the busy case
    sets eagle.tuning.machine_load.BUSY itself)."""
    from eagle.tuning import machine_load

    monkeypatch.setattr(machine_load, "BUSY", 1.0)
