"""EAGLE-3 heads of more than one decoder layer (eagle/heads/eagle3.py), and deepening a trained head
(`train.head_layers`, train/head_init.py): lossless decoding, the layout vLLM reads, and a deepened
start that computes what its start did until training moves its new layers."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file

from eagle.heads.checkpoint import load_head, save_head
from eagle.heads.formats import FormatError, engines
from eagle.model import EaModel
from tests.tiny import TREES, hf_greedy, prompt, random_eagle3_head, random_head, subset, tiny_llama
from train.head_init import initial_head


@pytest.mark.parametrize("tree", list(TREES))
def test_a_two_layer_eagle3_head_decodes_losslessly(tree):
    target = tiny_llama(5)
    head = random_eagle3_head(target, vocab_ids=subset(128, 48, 5), seed=6, num_hidden_layers=2)
    model = EaModel(target, head, settings=TREES[tree])
    for p in range(2):
        x = prompt(p, 4 + 5 * p)
        assert torch.equal(model.eagenerate(x, max_new_tokens=24), hf_greedy(target, x, 24))


@torch.no_grad()
def test_the_second_layer_is_a_llama_layer_over_the_state():
    """a_t = layer1(layer0's output): vLLM's stacking, written out from its definition."""
    one = random_eagle3_head(tiny_llama(0), seed=2)
    two = random_eagle3_head(tiny_llama(0), seed=2, num_hidden_layers=2)
    two.midlayer.load_state_dict(one.midlayer.state_dict())
    two.fc.load_state_dict(one.fc.state_dict())
    h = one.config.hidden_size
    fused, embeds, pos = torch.randn(1, 6, 2 * h), torch.randn(1, 6, h), torch.arange(6)[None]
    a, (k1, _) = one(fused, embeds, pos)
    layer = two.layers["1"]
    x = layer.input_layernorm(a)
    attn, _ = layer.self_attn(x, two._rope(a, pos), None, None)
    b = a + attn
    b = b + layer.mlp(layer.post_attention_layernorm(b))
    out, (k2, _) = two(fused, embeds, pos)
    torch.testing.assert_close(out, b)
    assert k2.shape[1] == 2 * k1.shape[1]  # the layers' caches side by side


@pytest.mark.parametrize("kind", ["eagle2", "eagle3"])
def test_a_deepened_start_computes_what_its_start_did(kind):
    target = tiny_llama(3)
    start = random_eagle3_head(target, seed=1) if kind == "eagle3" else random_head(target, seed=1)
    config = copy.deepcopy(start.config)
    config.num_hidden_layers = start.config.num_hidden_layers + 1
    head = initial_head(config, start, "start")
    new = "layers.1."  # EAGLE-3: after midlayer; EAGLE-1/2: after layers.0
    assert any(k.startswith(new) for k in head.state_dict())
    width = head.fc.in_features if kind == "eagle3" else head.config.hidden_size
    h = head.config.hidden_size
    feats, embeds, pos = torch.randn(2, 7, width), torch.randn(2, 7, h), torch.arange(7)[None].expand(2, 7)
    with torch.no_grad():
        torch.testing.assert_close(head(feats, embeds, pos)[0], start(feats, embeds, pos)[0])
    out, _ = head(feats, embeds, pos)
    out.square().sum().backward()
    grads = {k: p.grad for k, p in head.named_parameters() if k.startswith(new)}
    assert grads[new + "self_attn.o_proj.weight"].abs().sum() > 0  # the zero projections learn first
    assert grads[new + "mlp.down_proj.weight"].abs().sum() > 0


def test_a_fine_tune_cannot_drop_its_starts_layers():
    from train.head_config import deepen

    start = random_eagle3_head(tiny_llama(0), num_hidden_layers=2)
    draft = copy.deepcopy(start.config)
    with pytest.raises(ValueError, match="keeps them all"):
        deepen(draft, 1, start.config, "start")
    deepen(draft, 3, start.config, "start")
    assert draft.num_hidden_layers == 3


def test_vllm_reads_the_layers_by_its_own_names_and_sglang_is_refused(tmp_path):
    target = tiny_llama(2)
    head = random_eagle3_head(target, vocab_ids=subset(128, 40, 2), seed=3, num_hidden_layers=2)
    save_head(tmp_path / "h", head, dtype=torch.float32, fmt="vllm")
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["architectures"] == ["LlamaForCausalLMEagle3"]
    stored = load_file(str(tmp_path / "h" / "model.safetensors"))
    assert "midlayer.self_attn.q_proj.weight" in stored and "layers.1.self_attn.q_proj.weight" in stored
    assert stored["layers.1.self_attn.q_proj.weight"].shape[1] == head.config.hidden_size  # H wide, not 2H
    loaded = load_head(tmp_path / "h")
    for k, v in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    save_head(tmp_path / "s", head, dtype=torch.float32, fmt="speculators")
    assert "layers.1.mlp.down_proj.weight" in load_file(str(tmp_path / "s" / "model.safetensors"))
    assert engines(head.config, "eagle") == ["vllm"]
    with pytest.raises(FormatError, match="one decoder layer"):
        save_head(tmp_path / "g", head, dtype=torch.float32, fmt="sglang")
