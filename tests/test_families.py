"""Every common decoder family (tests/families.py) through the pipeline: fp32 greedy output equals
HF `generate` (dynamic tree, static tree, prompt lookup; prompts and decodes longer than the
sliding window), the committed KV cache equals a fresh prefill for every cache-layer type
transformers builds, and data_prep -> training (EAGLE-2 and EAGLE-3) -> export -> decoding runs."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from transformers import DynamicCache

from eagle.model import EaModel
from eagle.decoding.settings import TreeSettings
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


# ---- the whole pipeline per family: data_prep -> train (EAGLE-2, EAGLE-3) -> export -> decode -----------


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    path = tmp_path_factory.mktemp("family-data") / "chats.jsonl"
    rows = [{"conversations": [{"from": "human", "value": f"Question {i}: what is {i} plus {i}?"},
                               {"from": "gpt", "value": f"{i} plus {i} is {2 * i}. " * (2 + i % 4)}]} for i in range(24)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def family_folder(family: str, out) -> str:
    """The family's tiny target saved as a HF folder, with the embedded default's ChatML tokenizer."""
    from eagle.targets.tokenizer import load_tokenizer
    from tests.tiny import embedded_target_or_skip

    tokenizer = load_tokenizer(embedded_target_or_skip())
    target = family_target(family, 5, vocab_size=len(tokenizer))
    target.config.eos_token_id = target.generation_config.eos_token_id = tokenizer.eos_token_id
    target.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_through_data_prep_training_export_and_decoding(family, chats, tmp_path):
    from hydra import compose, initialize_config_dir

    from data_prep.pipeline import prepare
    from eagle.heads.checkpoint import load_head
    from tests.tiny import CONF
    from train.config import validate
    from train.trainer import Trainer

    folder = family_folder(family, tmp_path / "target")
    for head, extra in (("eagle2", []), ("eagle3", ["head=eagle3", "model.feature_layers=[0,1,-1]", "train.draft_vocab=512"])):
        overrides = ["+model=smollm2_135m", f"model.path={folder}", "model.dtype=float32", f"data.source={chats}",
                     "data.shard_records=8", "data.batch_tokens=512", f"store_dir={tmp_path / head / 'store'}",
                     f"output_dir={tmp_path / head}", "wandb.mode=disabled", "train.batch_tokens=512",
                     "train.max_steps=3", "train.warmup_steps=1", "train.eval_every=0", "train.save_every=0",
                     "train.tau_every=0", "train.progress=false", "deepspeed=zero0_fp32", "train.export_dtype=float32",
                     *extra]
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = validate(compose(config_name="config", overrides=overrides))
        prepare(cfg)
        head_dir = Trainer(cfg).fit().head_dir
        model = EaModel.from_pretrained(folder, head_dir, settings=KINDS["dynamic"])
        assert load_head(head_dir).config.architecture == head
        ids = prompt(7, 2 * WINDOW + 1, vocab=100)
        assert torch.equal(model.eagenerate(ids, max_new_tokens=12), hf_greedy(model.target, ids, 12)), head
