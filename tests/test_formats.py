"""Serving layouts (eagle/heads/formats.py): every export loads back losslessly, and holds what its engine reads."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle.heads.checkpoint import load_head, save_head
from eagle.heads.formats import DRAFT_VOCAB, FORMATS, TOKEN_MAP, FormatError
from eagle.model import EaModel
from tests.tiny import TREES, hf_greedy, near_bigram_pair, prompt, random_eagle3_head, subset, tiny_llama

OUR_FIELDS = ("architecture", "feature_layers", "fc_bias", "target", "format_version", "format")


def eagle2(bias: bool):
    target, head = near_bigram_pair(3)
    if not bias:
        head.fc.bias = None
        head.config.fc_bias = False
    head.draft_ids = subset(128, 96, 1)
    return target, head


def eagle3():
    target = tiny_llama(5, layers=4)
    return target, random_eagle3_head(target, layers=(1, 2, 3), vocab_ids=subset(128, 80, 2), seed=3)


def eagle3_norms():
    """speculators' layer variant, head=eagle3's default."""
    target = tiny_llama(5, layers=4)
    return target, random_eagle3_head(target, layers=(1, 2, 3), vocab_ids=subset(128, 80, 2), seed=3,
                                      norm_before_fc=True, norm_before_residual=True, norm_output=True)


HEADS = {"eagle2": lambda: eagle2(True), "eagle2-nobias": lambda: eagle2(False), "eagle3": eagle3,
         "eagle3-norms": eagle3_norms}
REFUSED = {("eagle2", "vllm"): "fc.bias", ("eagle2", "speculators"): "no EAGLE-1/2 model",
           ("eagle2-nobias", "speculators"): "no EAGLE-1/2 model", ("eagle3-norms", "sglang"): "norm_before_residual"}


def decode(target, head, seeds=range(3)):
    """(greedy outputs, τ) of our decoder with `head` on a few random prompts."""
    model = EaModel(target, head, None, TREES["dynamic"])
    outs, new, steps = [], 0, 0
    for s in seeds:
        ids = prompt(s, 10)
        outs.append(model.eagenerate(ids, max_new_tokens=24))
        new, steps = new + model.last_stats.new_tokens, steps + model.last_stats.steps
    return outs, new / steps


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", list(HEADS))
def test_every_layout_loads_back_with_the_same_weights_outputs_and_tau(tmp_path, kind, fmt):
    target, head = HEADS[kind]()
    if (kind, fmt) in REFUSED:
        with pytest.raises(FormatError, match=REFUSED[kind, fmt]):
            save_head(tmp_path / "h", head, dtype=torch.float32, fmt=fmt)
        assert not (tmp_path / "h").exists()
        return
    save_head(tmp_path / "h", head, dtype=torch.float32, fmt=fmt)
    loaded = load_head(tmp_path / "h")
    ours = head.state_dict()
    theirs = {k: v for k, v in loaded.state_dict().items() if not (k == "fc.bias" and "fc.bias" not in ours)}
    assert set(theirs) == set(ours) and all(torch.equal(ours[k], theirs[k]) for k in ours)
    if "fc.bias" in loaded.state_dict() and "fc.bias" not in ours:  # SGLang's layout: a zero bias
        assert not loaded.fc.bias.any()
    assert torch.equal(loaded.draft_ids, head.draft_ids)  # the frequency order too
    outs, tau = decode(target, head)
    outs2, tau2 = decode(target, loaded)
    assert tau2 == tau
    for a, b, s in zip(outs, outs2, range(3)):
        assert torch.equal(a, b) and torch.equal(a, hf_greedy(target, prompt(s, 10), 24)[:, : a.shape[1]])


@pytest.mark.parametrize("fmt", ["eagle", "vllm", "sglang", "speculators"])
def test_published_layouts_without_our_fields_load(tmp_path, fmt):
    """EAGLE's, SpecForge's, vLLM's, SGLang's and speculators' own heads carry none of our fields
    and no draft_vocab.json: the engines' fields alone must say what the head is."""
    target, head = eagle3()
    save_head(tmp_path / "h", head, dtype=torch.float32, fmt=fmt)
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    for key in OUR_FIELDS:
        config.pop(key, None)
    if fmt == "vllm":
        config.pop("eagle_config")  # vLLM's own heads name the layers at the top level only
    if fmt == "sglang":
        config.pop("eagle_aux_hidden_state_layer_ids")  # SGLang's only in eagle_config, as HF index - 1
    (tmp_path / "h" / "config.json").write_text(json.dumps(config))
    (tmp_path / "h" / DRAFT_VOCAB).unlink()
    loaded = load_head(tmp_path / "h")
    assert loaded.config.architecture == "eagle3" and loaded.config.feature_layers == [1, 2, 3]
    assert torch.equal(loaded.draft_ids, torch.sort(head.draft_ids).values)  # no frequency order: ascending
    assert torch.equal(decode(target, loaded)[0][0], decode(target, head)[0][0])


def test_vllm_and_sglang_read_what_they_need_from_one_eagle3_folder(tmp_path):
    _, head = eagle3()
    save_head(tmp_path / "h", head, dtype=torch.bfloat16)
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 1 and config["tie_word_embeddings"] is False
    assert config["draft_vocab_size"] == 80 and config["bias"] is False and config["torch_dtype"] == "bfloat16"
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # vLLM: HF hidden_states indices
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}  # SGLang: output of layer i
    stored = load_file(str(tmp_path / "h" / "model.safetensors"))
    assert "draft_rank" not in stored and {"d2t", "t2d", "lm_head.weight", "midlayer.hidden_norm.weight"} <= set(stored)


def test_sglang_eagle2_layout_has_its_bias_and_token_map(tmp_path):
    _, head = eagle2(False)
    save_head(tmp_path / "h", head, dtype=torch.float32, fmt="sglang")
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle"] and config["bias"] is True
    stored = load_file(str(tmp_path / "h" / "model.safetensors"))
    assert not stored["fc.bias"].any() and "d2t" not in stored
    assert torch.load(tmp_path / "h" / TOKEN_MAP).tolist() == sorted(head.draft_ids.tolist())


def test_speculators_layout_names_its_layer_and_verifier(tmp_path):
    _, head = eagle3()
    head.config.target = "org/target"
    save_head(tmp_path / "h", head, dtype=torch.bfloat16, fmt="speculators")
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["norm_before_residual"] is False
    assert config["speculators_config"]["verifier"]["name_or_path"] == "org/target"
    assert config["transformer_layer_config"]["num_hidden_layers"] == 1
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert any(k.startswith("layers.0.") for k in load_file(str(tmp_path / "h" / "model.safetensors")))


def test_a_speculators_variant_we_do_not_implement_is_refused(tmp_path):
    _, head = eagle3()
    save_head(tmp_path / "h", head, dtype=torch.float32, fmt="speculators")
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    config["fc_norm"] = True
    (tmp_path / "h" / "config.json").write_text(json.dumps(config))
    with pytest.raises(FormatError, match="fc_norm"):
        load_head(tmp_path / "h")


VARIANTS = {"norm_before_fc": True, "norm_before_residual": True, "norm_output": True}


@pytest.mark.parametrize("fmt", ["eagle", "speculators"])
def test_speculators_layer_variants_round_trip_and_decode_losslessly(tmp_path, fmt):
    """A head with speculators' default EAGLE-3 variant (its trainer's) keeps its flags and weights through
    both layouts, and our decoder's greedy output with it equals HF's."""
    target = tiny_llama(5, layers=4)
    head = random_eagle3_head(target, layers=(1, 2, 3), vocab_ids=subset(128, 80, 2), seed=3, **VARIANTS)
    with torch.no_grad():
        head.input_norm.weight.uniform_(0.5, 1.5)  # not the identity, so a lost norm would show
    save_head(tmp_path / "h", head, dtype=torch.float32, fmt=fmt)
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    assert all(config[k] is True for k in VARIANTS)
    loaded = load_head(tmp_path / "h")
    assert all(getattr(loaded.config, k) for k in VARIANTS)
    for key, value in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    outputs, _ = decode(target, loaded)
    for seed, out in zip(range(3), outputs):
        assert torch.equal(out, hf_greedy(target, prompt(seed, 10), 24))


def test_a_draft_vocab_file_that_disagrees_with_d2t_is_refused(tmp_path):
    _, head = eagle3()
    save_head(tmp_path / "h", head, dtype=torch.float32)
    (tmp_path / "h" / DRAFT_VOCAB).write_text(json.dumps({"target_ids": list(range(80))}))
    with pytest.raises(FormatError, match="name different tokens"):
        load_head(tmp_path / "h")


def test_heads_saved_before_the_layouts_still_load(tmp_path):
    """An older layout of ours: our own config fields only, draft_rank among the weights."""
    _, head = eagle3()
    save_head(tmp_path / "h", head, dtype=torch.float32)
    state = load_file(str(tmp_path / "h" / "model.safetensors"))
    state["draft_rank"] = torch.argsort(head.draft_ids)
    save_file(state, str(tmp_path / "h" / "model.safetensors"))
    (tmp_path / "h" / DRAFT_VOCAB).unlink()
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    (tmp_path / "h" / "config.json").write_text(json.dumps({k: config[k] for k in OUR_FIELDS[:-1] if k in config} | {
        k: config[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                               "vocab_size", "head_dim", "rope_theta", "draft_vocab_size")}))
    loaded = load_head(tmp_path / "h")
    assert torch.equal(loaded.draft_ids, head.draft_ids) and torch.equal(loaded.lm_head.weight, head.lm_head.weight)


def test_publish_writes_a_layout_with_its_serve_commands(tmp_path, capsys):
    from train.publish import main

    _, head = eagle2(True)
    save_head(tmp_path / "head", head, dtype=torch.float32, card="# tiny\n")
    assert main([str(tmp_path / "head"), "--format", "sglang"]) == 0
    out = tmp_path / "head-sglang"
    assert capsys.readouterr().out.strip() == str(out)
    card = (out / "README.md").read_text()
    assert card.startswith("# tiny") and "--speculative-algorithm EAGLE " in card and "hot_token_map.pt" in card
    assert main([str(tmp_path / "head"), "--format", "vllm"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train.fc_bias=false" in err


def test_publish_names_the_target_by_the_id_engines_load_it_by(tmp_path):
    """A head trained on a local folder, exported for speculators: its verifier and the card's
    commands name the target by its Hub id."""
    from train.publish import main

    _, head = eagle3()
    head.config.target = "tiny-local"
    save_head(tmp_path / "head", head, dtype=torch.float32, card="# tiny\n")
    out = tmp_path / "spec"
    assert main([str(tmp_path / "head"), "--format", "speculators", "--target", "org/tiny", "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == "org/tiny" == config["target"]
    assert "vllm serve org/tiny " in (out / "README.md").read_text()
    assert load_head(out).config.target == "org/tiny"


def test_publish_names_a_packaged_target_by_the_hub_model_it_ships(tmp_path):
    """Without --target, a head trained on the embedded default's alias is published for the Hub
    model the alias ships (the alias means nothing to vLLM or the Hub); other names stay as they are."""
    from eagle.targets.resolve import EMBEDDED_DEFAULT
    from train.publish import main

    for trained_for, published_for in ((EMBEDDED_DEFAULT, "HuggingFaceTB/SmolLM2-135M-Instruct"), ("org/x", "org/x")):
        _, head = eagle3()
        head.config.target = trained_for
        save_head(tmp_path / "head", head, dtype=torch.float32, card="# tiny\n")
        out = tmp_path / f"spec-{trained_for.replace('/', '_')}"
        assert main([str(tmp_path / "head"), "--format", "speculators", "--out", str(out)]) == 0
        config = json.loads((out / "config.json").read_text())
        assert config["speculators_config"]["verifier"]["name_or_path"] == published_for == config["target"]
        assert f"vllm serve {published_for} " in (out / "README.md").read_text()


def test_a_head_with_speculators_norms_is_offered_only_to_engines_that_have_them(tmp_path):
    """EAGLE's and SGLang's EAGLE-3 layers would load the weights and compute another function
    (SGLang has speculators' norm before fc and on the output, not the one before the residual)."""
    from train.publish import main

    _, head = eagle3_norms()
    save_head(tmp_path / "head", head, dtype=torch.float32, card="# tiny\n")
    assert main([str(tmp_path / "head"), "--format", "eagle", "--out", str(tmp_path / "out")]) == 0
    card = (tmp_path / "out" / "README.md").read_text()
    assert "loads unmodified in: vllm, and in our decoder" in card
    assert "vllm serve" in card and "sglang" not in card.lower() and "EConfig" not in card


def test_training_without_fc_bias_starts_from_a_head_with_one(tmp_path):
    from train.head_init import initial_head

    _, start = eagle2(True)
    config = json.loads(json.dumps(start.config.__dict__))
    from eagle.heads.eagle2 import DraftConfig

    cfg = DraftConfig(**{**config, "fc_bias": False})
    head = initial_head(cfg, start, "start")
    assert head.fc.bias is None and torch.equal(head.fc.weight, start.fc.weight)
    back = initial_head(DraftConfig(**config), head, "no-bias")
    assert not back.fc.bias.any()
