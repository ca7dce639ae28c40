"""Every common decoder family through the decoder: fp32 greedy output equals HF `generate`
(dynamic tree, static tree, prompt lookup; prompts and decodes longer than the sliding window),
and the committed KV cache equals a fresh prefill for every cache-layer type transformers builds."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import DynamicCache

from eagle.model import EaModel
from eagle.settings import TreeSettings
from tests.families import FAMILIES, SLIDING, WINDOW, family_target
from tests.tiny import TREES, bigram_head, hf_greedy, prompt, random_head

KINDS = {"dynamic": TREES["dynamic"], "static": TREES["static"], "lookup": replace(TREES["dynamic"], lookup=6)}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_equals_hf_generate_across_the_window(family, kind):
    accepted = []
    for seed, (target, head) in enumerate([(t, random_head(t, 10)) for t in [family_target(family, 0)]] +
                                          [(t, bigram_head(t, 11)) for t in [family_target(family, 1, coupling=0.05)]]):
        model = EaModel(target, head, settings=KINDS[kind])
        for p, length in enumerate((3, 2 * WINDOW + 3)):  # a prompt inside the window and one beyond it
            ids = prompt(10 * seed + p, length)
            assert torch.equal(model.eagenerate(ids, max_new_tokens=3 * WINDOW + 4), hf_greedy(target, ids, 3 * WINDOW + 4))
            accepted += model.last_stats.accept_lengths
    assert max(accepted) >= 3  # multi-token commits, across the window, really happen


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_committed_cache_equals_a_fresh_prefill(family):
    target = family_target(family, 2, coupling=0.15)
    model = EaModel(target, bigram_head(target, 3), settings=TreeSettings(total_token=10, depth=4, top_k=3))
    with torch.inference_mode():
        state, _ = model.prefill(prompt(4, 2 * WINDOW + 1))
        for _ in range(6):
            state, _ = model.step(state, model.draft(state))
        fresh = DynamicCache(config=target.config)
        target(state.ids[:, :-1], past_key_values=fresh, use_cache=True)
    kinds = set()
    for mine, theirs in zip(state.target_cache.layers, fresh.layers, strict=True):
        kinds.add(type(mine).__name__)
        assert type(mine) is type(theirs) and mine.keys.shape == theirs.keys.shape
        torch.testing.assert_close(mine.keys, theirs.keys, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(mine.values, theirs.values, rtol=1e-4, atol=1e-5)
        assert mine.get_seq_length() == theirs.get_seq_length() == state.committed
    assert ("DynamicSlidingWindowLayer" in kinds) == (family in SLIDING)
