"""Committing accepted tree rows: the cache must equal a fresh prefill of the same tokens."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from eagle.decoding.kv_commit import commit_cache, commit_rows
from eagle.decoding.tree import build_tree, tree_attention_mask
from tests.tiny import tiny_llama


def test_commit_rows_handles_overlap():
    x = torch.arange(10.0).view(1, 1, 10, 1)  # rows 0..9, past_len 3, tree rows 3..9
    out = commit_rows(x, 3, torch.tensor([0, 2, 3, 6]))  # tree nodes -> rows 3, 5, 6, 9
    assert out.flatten().tolist() == [0, 1, 2, 3, 5, 6, 9]


@pytest.mark.parametrize("path", [[0], [0, 1], [0, 2, 5], [0, 1, 3, 6], [0, 2, 4, 7]])
def test_commit_equals_fresh_prefill(path):
    model = tiny_llama(1)
    g = torch.Generator().manual_seed(7)
    prefix = torch.randint(0, 128, (1, 6), generator=g)
    #        0
    #     1     2
    #     3   4   5
    #     6   7
    parents = torch.tensor([-1, 0, 0, 1, 2, 2, 3, 4])
    tree = build_tree(torch.randint(0, 128, (8,), generator=g), parents)
    past = prefix.shape[1]
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(input_ids=prefix, past_key_values=cache, use_cache=True)
        mask = tree_attention_mask(tree.ancestors, past, torch.float32)
        model(input_ids=tree.tokens[None], position_ids=(past + tree.depths)[None], attention_mask=mask,
              past_key_values=cache, use_cache=True)
        commit_cache(cache, past, torch.tensor(path))
        fresh = DynamicCache(config=model.config)
        tokens = torch.cat([prefix[0], tree.tokens[path]])[None]
        model(input_ids=tokens, past_key_values=fresh, use_cache=True)
    assert cache.get_seq_length() == past + len(path)
    for ours, ref in zip(cache.layers, fresh.layers):
        assert ours.keys.shape == ref.keys.shape
        assert torch.allclose(ours.keys, ref.keys, atol=1e-5)
        assert torch.allclose(ours.values, ref.values, atol=1e-5)
    # and decoding continues exactly like after the fresh prefill
    with torch.no_grad():
        nxt = torch.tensor([[3]])
        a = model(input_ids=nxt, past_key_values=cache, use_cache=True).logits
        b = model(input_ids=nxt, past_key_values=fresh, use_cache=True).logits
    assert torch.allclose(a, b, atol=1e-5)
