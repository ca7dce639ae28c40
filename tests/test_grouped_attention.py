"""eagle/compiled/grouped_attention.py: grouped-query attention with the heads of a group as rows equals HF's
`sdpa` attention (keys and values repeated per head) under a tree mask, and the wrapper it
installs leaves every call without its keyword to HF's function."""

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from eagle.compiled import grouped_attention


class _Heads(torch.nn.Module):
    num_key_value_groups = 3
    is_causal = True


def _inputs(rows: int, length: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(1, 9, rows, 16, generator=g)
    key, value = torch.randn(1, 3, length, 16, generator=g), torch.randn(1, 3, length, 16, generator=g)
    visible = torch.rand(rows, length, generator=g) < 0.6
    visible[torch.arange(rows), torch.arange(rows) + length - rows] = True  # every row sees itself
    mask = torch.zeros(1, 1, rows, length).masked_fill_(~visible, torch.finfo(torch.float32).min)
    return query, key, value, mask


def test_grouped_heads_as_rows_equal_repeated_keys():
    for rows in (1, 2, 8):
        query, key, value, mask = _inputs(rows, 40, seed=rows)
        expected, _ = sdpa_attention_forward(_Heads(), query, key, value, mask, scaling=0.25)
        got = grouped_attention.grouped_attention(query, key, value, mask, 0.25)
        assert got.shape == expected.shape == (1, rows, 9, 16)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_wrapper_routes_only_calls_that_ask_for_it(monkeypatch):
    calls = []

    def hf(module, query, key, value, mask, dropout=0.0, scaling=None, **kwargs):
        calls.append(kwargs)
        return "hf", None

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, "sdpa", hf)
    grouped_attention.install_grouped_sdpa()
    grouped_attention.install_grouped_sdpa()  # idempotent: one wrapper
    wrapped = ALL_ATTENTION_FUNCTIONS["sdpa"]
    assert wrapped.eagle_wraps is hf
    query, key, value, mask = _inputs(4, 12)
    assert wrapped(_Heads(), query, key, value, mask, scaling=0.25)[0] == "hf"
    assert wrapped(_Heads(), query, key, value, mask, scaling=0.25, softcap=30.0, eagle_grouped=True)[0] == "hf"
    assert all(grouped_attention.GROUPED not in kw for kw in calls)  # the keyword never reaches HF
    out, _ = wrapped(_Heads(), query, key, value, mask, scaling=0.25, eagle_grouped=True)
    assert out.shape == (1, 4, 9, 16) and len(calls) == 2


def test_a_compiled_forward_passes_one_cache_length_not_one_per_layer(monkeypatch):
    """Each layer's keys and values are marked dynamic on their own; told that they span the mask's columns
    (`same_length`), the traced graph keeps one length, so a call hands the C++ wrapper a few ints, not two per
    layer (each made into a tensor in Python at every call: ~0.4 ms a forward of the embedded default)."""
    from torch._inductor.utils import run_and_get_code

    from eagle.compiled.target_graphs import CompiledTarget
    from tests.tiny import prompt, tiny_llama

    monkeypatch.setenv("EAGLE_CPP_WRAPPER", "1")  # as our CPU graphs compile outside the tests
    ours = grouped_attention.same_length

    def int_args(check) -> int:
        monkeypatch.setattr(grouped_attention, "same_length", check)
        runner = CompiledTarget(tiny_llama(seed=3, layers=4))
        with torch.inference_mode(), torch._inductor.config.patch(fx_graph_cache=False):  # compiled: its code seen
            runner.prefill(prompt(0, 12), 32)
            _, code = run_and_get_code(lambda: runner.plain_step(runner, torch.tensor([5]), 12))
        assert code and "inductor_entry" in code[-1]  # the C++ wrapper our CPU graphs compile with
        return code[-1].count("aoti_torch_item_int64(inputs")

    assert int_args(ours) <= 3 < 8 <= int_args(lambda *_: None)
