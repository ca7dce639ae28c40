"""EAGLE-3 heads: architecture, checkpoints (ours and the authors' layout), lossless decoding and
the loss (the training-time test's equality with inference is in test_unroll.py)."""

from __future__ import annotations

import json

import pytest
import torch

from eagle.heads.checkpoint import load_head, save_head
from eagle.heads.eagle2 import DraftConfig
from eagle.heads.eagle3 import Eagle3Head
from eagle.heads.feature_layers import default_fused
from eagle.model import EaModel
from eagle.decoding.settings import TreeSettings
from tests.tiny import TREES, hf_greedy, prompt, random_eagle3_head, subset, tiny_llama
from train.loss import eagle3_loss, vocab_target


def test_default_layers_follow_the_paper():
    assert default_fused(32) == [2, 16, 29]
    assert default_fused(30) == [2, 15, 27]
    with pytest.raises(ValueError, match="too shallow"):
        default_fused(4)


def test_forward_fuses_wide_inputs_and_feeds_back_its_own_states():
    head = random_eagle3_head(tiny_llama(0))
    h = head.config.hidden_size
    fused, embeds, pos = torch.randn(1, 5, 2 * h), torch.randn(1, 5, h), torch.arange(5)[None]
    with torch.no_grad():
        out, (k, _) = head(fused, embeds, pos)
        again, _ = head(head.fc(fused), embeds, pos)  # an H-wide input skips fc
    assert out.shape == (1, 5, h) and k.shape[2] == 5
    torch.testing.assert_close(out, again)
    assert head.logits(out).shape == (1, 5, head.config.draft_vocab_size)


@torch.no_grad()
def test_speculators_variant_norms_the_fused_input_the_residual_and_the_fed_back_state():
    """norm_before_fc / norm_before_residual / norm_output, written out from their definition."""
    flags = {"norm_before_fc": True, "norm_before_residual": True, "norm_output": True}
    head = random_eagle3_head(tiny_llama(0), seed=4, **flags)
    for norm in (head.input_norm, head.norm, head.midlayer.hidden_norm):
        norm.weight.uniform_(0.5, 1.5)
    h, layer = head.config.hidden_size, head.midlayer
    fused, embeds, pos = torch.randn(1, 5, 2 * h), torch.randn(1, 5, h), torch.arange(5)[None]
    out, _ = head(fused, embeds, pos)
    g = head.fc(head.input_norm(fused))
    x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(g)], dim=-1)
    attn, _ = layer.self_attn(x, head._rope(g, pos), None, None)
    a = layer.hidden_norm(g) + attn
    a = a + layer.mlp(layer.post_attention_layernorm(a))
    torch.testing.assert_close(out, head.norm(a))
    torch.testing.assert_close(head.logits(out), head.lm_head(out))  # the state is normed once, not twice


@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("vocab", ["subset", "full"])
def test_greedy_equals_hf_generate(seed, tree, vocab):
    target = tiny_llama(seed)
    ids = subset(128, 48, seed) if vocab == "subset" else None
    model = EaModel(target, random_eagle3_head(target, vocab_ids=ids, seed=seed + 10), settings=TREES[tree])
    for p in range(2):
        x = prompt(10 * seed + p, 3 + 4 * p)
        assert torch.equal(model.eagenerate(x, max_new_tokens=24), hf_greedy(target, x, 24))


def test_draft_tokens_come_from_the_draft_vocabulary():
    target = tiny_llama(1)
    ids = subset(128, 20, 1)
    model = EaModel(target, random_eagle3_head(target, vocab_ids=ids), settings=TreeSettings(total_token=12, depth=4, top_k=3))
    x = prompt(1, 6)
    model.eagenerate(x, max_new_tokens=4)
    state, _ = model.prefill(x, model_params())
    tree = model.draft(state)
    assert set(tree.tokens[1:].tolist()) <= set(ids.tolist())
    assert model.draft_vocab_size == 20


def model_params():
    from eagle.decoding.verify import SamplingParams

    return SamplingParams(0.0, 0.0, 0)


def test_checkpoint_roundtrip(tmp_path):
    target = tiny_llama(2)
    head = random_eagle3_head(target, vocab_ids=subset(128, 40, 2), seed=3)
    save_head(tmp_path / "h", head, dtype=torch.float32)
    loaded = load_head(tmp_path / "h")
    assert isinstance(loaded, Eagle3Head) and loaded.config.feature_layers == [0, 1]
    assert torch.equal(loaded.draft_ids, head.draft_ids)
    for k, v in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_authors_layout_loads_and_decodes_losslessly(tmp_path):
    """A LlamaForCausalLMEagle3 config (no feature_layers: the decoder uses [2, N//2, N-3]),
    pytorch_model.bin with d2t/t2d and a copy of the target's embeddings."""
    target = tiny_llama(4, layers=7)
    ids = subset(128, 64, 4)
    cfg = DraftConfig.from_target_config(target.config)
    cfg.architecture, cfg.feature_layers, cfg.fc_bias, cfg.draft_vocab_size = "eagle3", [], False, 64
    torch.manual_seed(5)
    head = Eagle3Head(cfg)
    folder = tmp_path / "authors"
    folder.mkdir()
    t = target.config
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": t.hidden_size, "intermediate_size": t.intermediate_size,
        "num_attention_heads": t.num_attention_heads, "num_key_value_heads": t.num_key_value_heads,
        "num_hidden_layers": 1, "vocab_size": t.vocab_size, "draft_vocab_size": 64, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "max_position_embeddings": 512, "hidden_act": "silu", "torch_dtype": "float32",
    }))
    state = dict(head.state_dict())
    state["d2t"] = ids - torch.arange(64)
    state["t2d"] = torch.zeros(128, dtype=torch.bool).index_fill_(0, ids, True)
    state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
    torch.save(state, folder / "pytorch_model.bin")
    loaded = load_head(folder)
    assert isinstance(loaded, Eagle3Head) and torch.equal(loaded.draft_ids, ids)
    model = EaModel(target, loaded, settings=TreeSettings(total_token=12, depth=4, top_k=3))
    assert model.feature_layers == [2, 3, 4]
    x = prompt(4, 7)
    assert torch.equal(model.eagenerate(x, max_new_tokens=20), hf_greedy(target, x, 20))


def test_mismatched_vocabulary_is_rejected(tmp_path):
    target = tiny_llama(2)
    head = random_eagle3_head(target, vocab_ids=subset(128, 40, 2))
    save_head(tmp_path / "h", head)
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    cfg["draft_vocab_size"] = 41
    (tmp_path / "h" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError):
        load_head(tmp_path / "h")


def test_loss_is_restricted_to_the_draft_vocabulary():
    """CE over the draft vocabulary, rows whose target argmax falls outside it excluded from the
    loss but counted as top-1 misses; it is smallest when the draft copies the target's logits."""
    torch.manual_seed(0)
    v, h, n = 12, 6, 10
    lm_head = torch.randn(v, h)
    feats = torch.randn(1, n, h)
    mask = torch.ones(1, n, dtype=torch.bool)
    ids = torch.arange(6)  # draft vocabulary: target ids 0..5
    member = torch.zeros(v, dtype=torch.bool)
    member[ids] = True
    target = vocab_target(feats, mask, lm_head, ids, member)
    assert target.probs.shape == (n, 6)
    torch.testing.assert_close(target.probs.sum(-1), torch.ones(n))
    inside = target.in_vocab
    assert torch.equal(inside, (feats[0] @ lm_head.T).argmax(-1) < 6)
    assert 0 < int(inside.sum()) < n  # this seed has rows of both kinds

    def copy(states):  # the target's own restricted logits
        return states @ lm_head[ids].T

    best = eagle3_loss(copy, feats, mask, target, draft_ids=ids)
    worse = eagle3_loss(lambda s: 0.3 * copy(s), feats, mask, target, draft_ids=ids)
    assert best.loss < worse.loss
    assert float(best.sums["top1"]) == float(inside.sum())  # right exactly where the argmax is in the vocabulary
    later = eagle3_loss(copy, feats, mask, target, step=3, draft_ids=ids)
    assert float(later.sums["n"]) == n - 3


def test_saved_draft_ids_ascend_and_the_lm_head_rows_follow_them(tmp_path):
    """The stored layout SpecForge, EAGLE-3's trainer and speculators assume: draft id j is the
    j-th smallest target id and lm_head row j scores it; the frequency order comes back on load."""
    from safetensors.torch import load_file

    target = tiny_llama(3)
    ids = torch.tensor([90, 4, 57, 12, 101, 33])  # most frequent first
    head = random_eagle3_head(target, vocab_ids=ids, seed=8)
    save_head(tmp_path / "h", head, dtype=torch.float32)
    stored = load_file(str(tmp_path / "h" / "model.safetensors"))
    targets = stored["d2t"] + torch.arange(6)
    assert targets.tolist() == sorted(ids.tolist())
    for j, t in enumerate(targets.tolist()):
        assert torch.equal(stored["lm_head.weight"][j], head.lm_head.weight[ids.tolist().index(t)])
    loaded = load_head(tmp_path / "h")
    assert torch.equal(loaded.draft_ids, ids) and torch.equal(loaded.lm_head.weight, head.lm_head.weight)
