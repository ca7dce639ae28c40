"""Shared test fixtures: tiny seeded random Llama targets built in memory."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import data_prep  # noqa: F401  registers the resolvers the Hydra configs use, for tests that compose them


@pytest.fixture(autouse=True)
def _single_thread():
    """Tests use tiny models, which run fastest on one thread; on a shared CPU two threads
    were measured 10-40x slower than one (oversubscription)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_llama(seed: int = 0, vocab_size: int = 128, hidden_size: int = 64, layers: int = 2,
               dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    """A seeded random Llama small enough for unit tests (sdpa attention, eval mode)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        tie_word_embeddings=False, attn_implementation="sdpa",
    )
    return LlamaForCausalLM(cfg).to(dtype).eval()


@pytest.fixture
def tiny_target():
    return tiny_llama()


def embedded_target_or_skip():
    """Path of the converted embedded default; skip when its package is not installed."""
    from eagle.targets import resolve_target

    try:
        return resolve_target("smollm2-135m-instruct")
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama saved as a HF folder with the embedded default's ChatML tokenizer."""
    from eagle.targets import load_tokenizer

    embedded = embedded_target_or_skip()
    out = tmp_path_factory.mktemp("tiny_target")
    tok = load_tokenizer(embedded)
    model = tiny_llama(seed=3, vocab_size=len(tok), hidden_size=64)
    model.config.eos_token_id = tok.eos_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
