"""eagle/compiled/attention_kernel.py: our C++ attention equals grouped SDPA under tree masks, skips hidden columns
and the bucket past them, and a compiled decoder takes it while decoding HF's greedy tokens."""

from __future__ import annotations

import pytest
import torch

from eagle.compiled import attention_kernel
from eagle.compiled.grouped_attention import grouped_attention
from eagle.decoding.settings import TreeSettings
from eagle.model import EaModel
from tests.tiny import hf_greedy, prompt, random_eagle3_head, tiny_llama

SMALL_TREE = TreeSettings(total_token=6, depth=3, top_k=4, lookup=0)  # verifies of at most 8 rows: the kernel's own


@pytest.fixture(scope="module")
def kernel():
    if not attention_kernel.ensure_built():
        pytest.skip("the attention kernel cannot be built here")


def _inputs(rows: int, length: int, dim: int, dtype: torch.dtype, seed: int, hidden=None):
    """Query [1, 6, rows, dim] over 2 key/value heads of `length` rows; a tree-like mask: the first `length - rows
    - 8` columns seen by all, then random columns, each row seeing itself, the last 8 columns (a bucket's unused
    rows) hidden from all."""
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(1, 6, rows, dim, generator=g).to(dtype)
    key, value = (torch.randn(1, 2, length, dim, generator=g).to(dtype) for _ in range(2))
    past = length - rows - 8
    visible = torch.zeros(rows, length, dtype=torch.bool)
    visible[:, :past] = True
    visible[:, past:past + rows] = torch.rand(rows, rows, generator=g) < 0.5
    visible[torch.arange(rows), past + torch.arange(rows)] = True
    low = torch.finfo(dtype).min if hidden is None else hidden
    mask = torch.zeros(1, 1, rows, length, dtype=dtype).masked_fill_(~visible, low)
    return query, key, value, mask, visible


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 8, 12, 24, 30])  # 30: past kMaxRows, ATen's SDPA inside the op
@pytest.mark.parametrize("dim", [16, 64])  # 64: the unrolled path
def test_kernel_equals_grouped_sdpa(kernel, dtype, rows, dim):
    query, key, value, mask, _ = _inputs(rows, 48, dim, dtype, seed=rows + dim)
    expected = grouped_attention(query.float(), key.float(), value.float(), mask.float(), dim ** -0.5)
    got = attention_kernel.masked_attention(query, key, value, mask, dim ** -0.5)
    assert got.shape == (1, rows, 6, dim) and got.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), expected, rtol=tolerance, atol=tolerance)


def test_hidden_columns_are_skipped_not_added(kernel):
    """NaN keys and values where the mask hides them (a tree's other branches, the bucket's unused rows) never reach
    the output; -inf hides as the dtype's lowest value does."""
    for hidden in (None, float("-inf")):
        query, key, value, mask, visible = _inputs(4, 40, 16, torch.float32, seed=1, hidden=hidden)
        expected = grouped_attention(query, key, value, mask.clamp(min=torch.finfo(torch.float32).min), 0.25)
        seen = visible.any(0)
        for x in (key, value):
            x[:, :, ~seen] = float("nan")
        got = attention_kernel.masked_attention(query, key, value, mask, 0.25)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_calls_it_cannot_take_go_elsewhere(kernel, monkeypatch):
    query, key, value, mask, _ = _inputs(2, 24, 16, torch.float32, seed=0)
    assert attention_kernel.applies(query, key, mask)
    assert not attention_kernel.applies(query, key, None)
    assert not attention_kernel.applies(query.bfloat16(), key.bfloat16(), mask)  # an fp32 mask over bf16 rows
    assert not attention_kernel.applies(query.expand(2, -1, -1, -1), key, mask)  # two sequences
    monkeypatch.setenv("EAGLE_ATTENTION", "0")
    assert not attention_kernel.applies(query, key, mask) and attention_kernel.key() == "sdpa"
    monkeypatch.setenv("EAGLE_ATTENTION", "maybe")
    with pytest.raises(ValueError, match="EAGLE_ATTENTION"):
        attention_kernel.wanted()


@pytest.mark.parametrize("choice", ["auto", "0"])
def test_a_compiled_decoder_takes_it_and_decodes_as_hf_greedy(kernel, monkeypatch, choice):
    """Plain steps (1 row) and verifies (at most 8 rows) of the compiled target call the op unless EAGLE_ATTENTION=0;
    either way greedy decoding gives HF's tokens."""
    monkeypatch.setenv("EAGLE_ATTENTION", choice)
    target = tiny_llama(seed=5)
    ids = prompt(0, 12)
    expected = hf_greedy(target, ids, 12)
    model = EaModel(target, random_eagle3_head(target), settings=SMALL_TREE, compile=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        assert torch.equal(model.naivegenerate(ids, max_new_tokens=12), expected)
        assert torch.equal(model.eagenerate(ids, max_new_tokens=12), expected)
    calls = sum(e.count for e in prof.key_averages() if e.key == "eagle::masked_attention")
    assert (calls > 0) == (choice == "auto")
