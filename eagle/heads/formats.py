"""Serving layouts of a draft head: what each consumer reads, written and read back here.

A head is saved in one of four layouts (`save_head(..., fmt=)`, `python -m train.publish --format`):

- `eagle` (default): EAGLE's published layout. A LlamaConfig-style config.json
  (`architectures`, `model_type`, `num_hidden_layers`, `bias`, `draft_vocab_size`,
  `tie_word_embeddings: false`, dtype) plus our own fields (`architecture`, `feature_layers`,
  `fc_bias`, `target`), which the engines ignore; EAGLE's weight names (`fc`, `layers.0` or
  EAGLE-3's `midlayer`, `norm`, `lm_head`, `d2t`, `t2d`). vLLM and SGLang load an EAGLE-3 head in
  this layout as it is (with speculators' variant norms, below: vLLM only), and vLLM loads an
  EAGLE-1/2 head without fc bias (`train.fc_bias=false`).
- `vllm`: the same files, refused for an EAGLE-1/2 head with an fc bias (vLLM's model has none).
- `sglang`: the same for EAGLE-3; EAGLE-1/2 as `LlamaForCausalLMEagle` with an fc bias (zero when
  the head has none: SGLang always builds one) and the draft vocabulary as `hot_token_map.pt`,
  the file `--speculative-token-map` takes. Refused for speculators' EAGLE-3 variant with
  `norm_before_residual` (`train.eagle3_norms=true`, head=eagle3's default), which SGLang's layer
  lacks; vLLM and speculators serve all three variant flags, EAGLE's own code none. An EAGLE-3 head of
  more than one decoder layer (`layers.1`... after `midlayer`, eagle/heads/eagle3.py) is vLLM's alone.
- `speculators`: speculators' `speculators_config` layout for EAGLE-3 (`layers.0.*` weights),
  which vLLM also serves; speculators has no EAGLE-1/2 model.

The draft vocabulary in the frequency order our decoder's `draft_vocab=N` needs travels as
`draft_vocab.json` (no engine has a place for it in the weights); EAGLE-1/2 models have no
`d2t`/`t2d`, so an EAGLE-1/2 head's vocabulary lives only there (and in SGLang's token map).

Layer conventions for EAGLE-3's fused target layers (our `feature_layers` index HF's
`hidden_states`, 0 = the embeddings): vLLM and speculators use the same numbers; SGLang captures
"the output of layer i", HF index i + 1, so it is written as ours − 1 under `eagle_config`.
Reading (`read_config`, `normalise_state`) accepts all four, and the same layouts without our
fields (EAGLE's, SpecForge's, speculators' published heads).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

from eagle.heads.eagle2 import DraftConfig
from eagle.heads.draft_vocab import ids_from_stored, stored_tensors

FORMATS = ("eagle", "vllm", "sglang", "speculators")
DRAFT_VOCAB = "draft_vocab.json"  # {"target_ids": [...]}: the draft vocabulary, most frequent first
TOKEN_MAP = "hot_token_map.pt"  # SGLang --speculative-token-map: the draft vocabulary's target ids
VOCAB_KEYS = ("d2t", "t2d", "draft_rank")
LAYER_VARIANTS = ("norm_before_fc", "norm_before_residual", "norm_output")  # DraftConfig's EAGLE-3 variants
VARIANTS_READ = {"eagle": (), "sglang": ("norm_before_fc", "norm_output"),  # which of them each engine's layer has
                 "vllm": LAYER_VARIANTS, "speculators": LAYER_VARIANTS}
LAYERS_BUILT = {"eagle": 1, "sglang": 1}  # EAGLE-3 decoder layers an engine's model builds (vLLM's stacks any number)
_ARCH = {  # (SGLang's EAGLE-1/2 layout?, architecture) -> config "architectures"
    (False, "eagle2"): "LlamaForCausalLM",  # EAGLE's published EAGLE-1/2 heads; vLLM prefixes "Eagle"
    (True, "eagle2"): "LlamaForCausalLMEagle",
    (False, "eagle3"): "LlamaForCausalLMEagle3",  # one layout for EAGLE, vLLM and SGLang
}


class FormatError(ValueError):
    """A head that the asked layout cannot hold, or a folder no layout explains; one line."""


def check_format(fmt: str, cfg: DraftConfig) -> None:
    """Refuse a (format, head) pair the consumer cannot serve, saying why and what to do."""
    if fmt not in FORMATS:
        raise FormatError(f"format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if fmt == "speculators" and cfg.architecture != "eagle3":
        raise FormatError("speculators 0.9 has no EAGLE-1/2 model (only eagle3, peagle, dflash, mtp): "
                          "export an EAGLE-1/2 head as eagle, vllm or sglang")
    if fmt == "sglang" and unread_variants(cfg, "sglang"):  # only norm_before_residual
        raise FormatError("SGLang 0.5.23's EAGLE-3 layer adds its attention output to the raw feature, not the normed "
                          "one (norm_before_residual, speculators' variant, train.eagle3_norms=true): it would draft "
                          "from another function; serve this head with vLLM (eagle or speculators layout), or train "
                          "with train.eagle3_norms=false for SGLang")
    if fmt == "sglang" and cfg.architecture == "eagle3" and too_deep(cfg, "sglang"):
        raise FormatError(f"SGLang 0.5.23's EAGLE-3 model has one decoder layer, this head {cfg.num_hidden_layers}: "
                          "serve it with vLLM (eagle, vllm or speculators layout)")
    if fmt == "vllm" and cfg.architecture == "eagle2" and cfg.fc_bias:
        raise FormatError("vLLM's EAGLE-1 model builds fc without a bias and refuses fc.bias: "
                          "train the head with train.fc_bias=false (or export it as eagle / sglang)")


# ---- writing ------------------------------------------------------------------------------------


def export_files(fmt: str, cfg: DraftConfig, state: dict[str, torch.Tensor], dtype: torch.dtype
                 ) -> tuple[dict, dict[str, torch.Tensor], dict[str, object]]:
    """(config.json dict, weights, side files {name: JSON-able or tensor}) of `fmt`.

    `state` is the head as `save_head` stores it: EAGLE's key names, and when it has a draft
    vocabulary, d2t/t2d/draft_rank with an EAGLE-3 lm_head's rows in ascending (d2t) order.
    """
    check_format(fmt, cfg)
    state = dict(state)
    side: dict[str, object] = {}
    if "d2t" in state:
        by_frequency, _ = ids_from_stored(state, "the export")
        ids = state["d2t"] + torch.arange(state["d2t"].numel())  # [N] ascending target ids
        state.pop("draft_rank", None)  # no engine has a place for it
        side[DRAFT_VOCAB] = {"target_ids": by_frequency.tolist()}
        if cfg.architecture == "eagle2":  # EAGLE's, vLLM's and SGLang's EAGLE-1/2 models have no d2t/t2d
            del state["d2t"], state["t2d"]
            if fmt == "sglang":
                side[TOKEN_MAP] = ids
    if fmt == "sglang" and cfg.architecture == "eagle2" and "fc.bias" not in state:
        state["fc.bias"] = torch.zeros(cfg.hidden_size, dtype=dtype)  # SGLang always builds one
    if fmt == "speculators":
        state = {k.replace("midlayer.", "layers.0.", 1): v for k, v in state.items()}
        return speculators_config(cfg, dtype), state, side
    return llama_style_config(cfg, fmt, dtype), state, side


def llama_style_config(cfg: DraftConfig, fmt: str, dtype: torch.dtype) -> dict:
    """The LlamaConfig-style config.json EAGLE, vLLM and SGLang read, plus our own fields.

    An EAGLE-3 head's fused layers are written in both engines' conventions at once (vLLM reads
    the top-level ids first, SGLang only `eagle_config`), so one folder serves both.
    """
    sglang_eagle2 = fmt == "sglang" and cfg.architecture == "eagle2"
    ours = {**asdict(cfg), "fc_bias": cfg.fc_bias or sglang_eagle2}
    out = {
        "architectures": [_ARCH[sglang_eagle2, cfg.architecture]],
        "model_type": "llama",
        **_llama_fields(cfg, dtype),
        "bias": ours["fc_bias"],  # EAGLE's and SGLang's key
    }
    if cfg.architecture == "eagle3":
        out["draft_vocab_size"] = cfg.draft_vocab_size or cfg.vocab_size
        if cfg.feature_layers:  # [] = the default [2, N//2, N-3], which both engines assume too
            out["eagle_aux_hidden_state_layer_ids"] = list(cfg.feature_layers)
            out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in cfg.feature_layers]}
    else:
        ours.pop("draft_vocab_size")
    return {**out, **ours, "format": fmt}


def speculators_config(cfg: DraftConfig, dtype: torch.dtype) -> dict:
    """speculators' Eagle3SpeculatorConfig, as its own converter writes it (verifier: our target)."""
    layer = {"model_type": "llama", **_llama_fields(cfg, dtype), "mlp_bias": False, "initializer_range": 0.02}
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "draft_vocab_size": cfg.draft_vocab_size or cfg.vocab_size,
        **{k: getattr(cfg, k) for k in LAYER_VARIANTS}, "fc_norm": False, "embed_requires_grad": False,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": list(cfg.feature_layers) or None,
        "tie_word_embeddings": False,
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3,
                                  "accept_tolerance": 0.0, "verifier_accept_k": 1}],
            "verifier": {"name_or_path": cfg.target, "architectures": ["LlamaForCausalLM"]},
        },
        "target": cfg.target,
        "format": "speculators",
    }


def _llama_fields(cfg: DraftConfig, dtype: torch.dtype) -> dict:
    rope = {"rope_type": "default", **(cfg.rope_scaling or {}), "rope_theta": cfg.rope_theta}
    return {
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim, "vocab_size": cfg.vocab_size, "num_hidden_layers": cfg.num_hidden_layers,
        "rms_norm_eps": cfg.rms_norm_eps, "max_position_embeddings": cfg.max_position_embeddings,
        "hidden_act": cfg.hidden_act, "attention_bias": cfg.attention_bias,
        "rope_theta": cfg.rope_theta, "rope_scaling": cfg.rope_scaling, "rope_parameters": rope,
        "tie_word_embeddings": False,  # the head's lm_head (EAGLE-3) is its own, never the embedding
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def write_side_files(directory: Path, side: dict[str, object]) -> None:
    for name, value in side.items():
        if isinstance(value, torch.Tensor):
            torch.save(value.to(torch.int64), directory / name)
        else:
            (directory / name).write_text(json.dumps(value) + "\n")


# ---- reading ------------------------------------------------------------------------------------


def read_config(path: Path) -> dict:
    """config.json of any layout as the fields DraftConfig reads (speculators' nested one flattened)."""
    try:
        raw = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:  # truncated or not JSON
        raise FormatError(f"{path}: not a JSON config ({e}); the head folder is damaged, export it again") from None
    if not isinstance(raw, dict):
        raise FormatError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    if raw.get("speculators_model_type") is not None:
        return _from_speculators(raw, path)
    if "architecture" not in raw and "eagle_config" in raw:  # SGLang's convention, without our fields
        ids = (raw["eagle_config"] or {}).get("eagle_aux_hidden_state_layer_ids")
        if ids:
            raw["feature_layers"] = [i + 1 for i in ids]
    elif "architecture" not in raw and raw.get("eagle_aux_hidden_state_layer_ids"):
        raw["feature_layers"] = list(raw["eagle_aux_hidden_state_layer_ids"])
    if "architecture" not in raw and "LlamaForCausalLMEagle" in (raw.get("architectures") or []):
        raw.setdefault("bias", True)  # SGLang's EAGLE-1/2 model always has the fc bias
    return raw


def _from_speculators(raw: dict, path: Path) -> dict:
    kind = raw["speculators_model_type"]
    if kind != "eagle3":
        raise FormatError(f"{path}: speculators model type {kind!r}: only eagle3 heads load here")
    if raw.get("fc_norm"):
        raise FormatError(f"{path}: fc_norm=true (one norm per fused layer) is a layer variant our EAGLE-3 head "
                          f"does not implement")
    layer = dict(raw.get("transformer_layer_config") or {})
    if not layer:
        raise FormatError(f"{path}: a speculators config without transformer_layer_config")
    rope = layer.get("rope_parameters") or {}
    return {
        **layer,
        "rope_theta": layer.get("rope_theta", rope.get("rope_theta", 10000.0)),
        "architecture": "eagle3",
        "fc_bias": False,
        **{k: bool(raw.get(k)) for k in LAYER_VARIANTS},
        "draft_vocab_size": raw.get("draft_vocab_size"),
        "feature_layers": list(raw.get("eagle_aux_hidden_state_layer_ids") or []),
        "target": raw.get("target") or ((raw.get("speculators_config") or {}).get("verifier") or {}).get(
            "name_or_path", ""),
    }


def normalise_state(state: dict[str, torch.Tensor], cfg: DraftConfig, directory: Path) -> dict[str, torch.Tensor]:
    """Weights of any layout under our key names, with the draft vocabulary as d2t/t2d/draft_rank."""
    out = {}
    for key, value in state.items():
        key = key.removeprefix("model.")
        if cfg.architecture == "eagle3":
            key = key.replace("layers.0.", "midlayer.", 1) if key.startswith("layers.0.") else key
        out[key] = value
    ids = _side_vocabulary(directory)
    if ids is not None:
        if "d2t" in out and not torch.equal(torch.sort(ids).values, out["d2t"] + torch.arange(out["d2t"].numel())):
            raise FormatError(f"{directory}: {DRAFT_VOCAB} and the d2t of the weights name different tokens")
        out.update(stored_tensors(ids, cfg.vocab_size))
    return out


def _side_vocabulary(directory: Path) -> torch.Tensor | None:
    """The draft vocabulary (target ids, most frequent first) of draft_vocab.json or SGLang's token map."""
    if (directory / DRAFT_VOCAB).exists():
        try:
            ids = json.loads((directory / DRAFT_VOCAB).read_text())["target_ids"]
        except (ValueError, KeyError, TypeError) as e:
            raise FormatError(f"{directory / DRAFT_VOCAB}: expected {{\"target_ids\": [...]}} ({e})") from None
        return torch.tensor(ids, dtype=torch.int64)
    if (directory / TOKEN_MAP).exists():
        return torch.as_tensor(torch.load(directory / TOKEN_MAP, weights_only=True), dtype=torch.int64)
    return None


# ---- who serves what ----------------------------------------------------------------------------


def unread_variants(cfg: DraftConfig, engine: str) -> list[str]:
    """The layer variant flags `cfg` sets that `engine`'s EAGLE-3 layer does not have."""
    return [flag for flag in LAYER_VARIANTS if getattr(cfg, flag) and flag not in VARIANTS_READ[engine]]


def too_deep(cfg: DraftConfig, engine: str) -> bool:
    """Whether `cfg` stacks more EAGLE-3 decoder layers than `engine`'s model builds."""
    return cfg.num_hidden_layers > LAYERS_BUILT.get(engine, cfg.num_hidden_layers)


def engines(cfg: DraftConfig, fmt: str) -> list[str]:
    """The engines that load a head of `cfg` saved as `fmt` unmodified and compute what it was trained
    to (our decoder loads every layout): an engine whose layer lacks a variant flag the head sets
    (VARIANTS_READ) would load it and draft from another function."""
    if cfg.architecture == "eagle3":
        loaders = ["vllm", "speculators"] if fmt == "speculators" else ["eagle", "vllm", "sglang"]
        return [engine for engine in loaders if not unread_variants(cfg, engine) and not too_deep(cfg, engine)]
    if fmt == "sglang":
        return ["sglang"]
    return ["eagle"] + ([] if cfg.fc_bias else ["vllm"])
