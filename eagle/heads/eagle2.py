"""The EAGLE-1/2 draft head: `fc` over (token embedding, feature) plus one decoder layer (or a few).

The head predicts the target's next *feature* (last hidden state after the final norm, the
input of `lm_head`). Position t takes (f_t, x_{t+1}) and predicts f_{t+1}; the token
distribution of the draft is `lm_head(f̂_{t+1})` through the target's frozen `lm_head`.

The embedding and `lm_head` belong to the target: they are passed in, never stored here,
so `state_dict()` holds exactly the EAGLE key names (`fc.*`, `layers.0.*`).

The attention is written out (about 30 lines) rather than borrowed from a HF decoder layer
so that the KV cache is explicit: the decoder appends tree nodes and later crops back to the
committed prefix, which is a slice of two tensors.

EAGLE's heads have one decoder layer; `num_hidden_layers` > 1 stacks more, as EAGLE's own
code allows (layers after the first normalise their input: `layers.1.input_layernorm`). Their
caches travel as one: layer i owns KV heads [i*kvH, (i+1)*kvH) of the returned tensors, so the
decoder and the trainer handle a deeper head's cache exactly like a one-layer head's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

FORMAT_VERSION = 1


@dataclass
class DraftConfig:
    """Sizes of the head; written as `config.json` next to the weights."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 4096
    attention_bias: bool = False
    hidden_act: str = "silu"
    num_hidden_layers: int = 1  # decoder layers of an EAGLE-1/2 head (EAGLE: 1)
    fc_bias: bool = True
    target: str = ""
    # Target hidden_states indices the head reads ([-1] = the last, post-norm: EAGLE-1/2).
    # EAGLE-3: three layer inputs; [] = the paper's default for the target's depth N, [2, N//2, N-3].
    feature_layers: list[int] = field(default_factory=lambda: [-1])
    architecture: str = "eagle2"  # eagle2 (EAGLE-1/2 head, this file) | eagle3 (eagle/heads/eagle3.py)
    draft_vocab_size: int | None = None  # eagle3: rows of the head's own lm_head
    # EAGLE-3 layer variants, named as speculators names them (all false: EAGLE-3 as its authors publish it)
    norm_before_fc: bool = False  # an RMSNorm (`input_norm`, 3H wide) on the fused layers before fc
    norm_before_residual: bool = False  # the decoder layer adds to the normed feature, not the raw one
    norm_output: bool = False  # the layer's output is normed once: that state is fed back and scored by lm_head
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads

    @classmethod
    def from_target_config(cls, cfg, target: str = "", feature_layers=(-1,)) -> "DraftConfig":
        """Size a head for a HF target config (Llama, Qwen2, Mistral... share these names)."""
        text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        rope = _rope_params(text)
        return cls(
            hidden_size=text.hidden_size,
            intermediate_size=text.intermediate_size,
            num_attention_heads=text.num_attention_heads,
            num_key_value_heads=getattr(text, "num_key_value_heads", None) or text.num_attention_heads,
            vocab_size=text.vocab_size,
            head_dim=getattr(text, "head_dim", None),
            rms_norm_eps=getattr(text, "rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", 10000.0),
            rope_scaling={k: v for k, v in rope.items() if k != "rope_theta"} or None,
            max_position_embeddings=getattr(text, "max_position_embeddings", 4096),
            attention_bias=False,
            hidden_act=getattr(text, "hidden_act", "silu"),
            target=target,
            feature_layers=list(feature_layers),
        )

    @classmethod
    def from_dict(cls, raw: dict, path: str | Path) -> "DraftConfig":
        """The config of a parsed config.json, ours or EAGLE's LlamaConfig-style one (eagle/heads/formats.py
        flattens the other layouts); unknown keys are ignored, `path` names the file in errors."""
        known = set(cls.__dataclass_fields__)
        kwargs = {k: v for k, v in raw.items() if k in known}
        if "rope_parameters" in raw and "rope_theta" not in raw:  # transformers 5.x style
            rope = dict(raw["rope_parameters"] or {})
            kwargs["rope_theta"] = rope.pop("rope_theta", 10000.0)
            if rope.get("rope_type", "default") != "default":
                kwargs["rope_scaling"] = rope
        missing = {"hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"} - set(kwargs)
        if missing:
            raise ValueError(f"{path}: draft config lacks field(s) {sorted(missing)}")
        kwargs.setdefault("num_key_value_heads", kwargs["num_attention_heads"])
        if "bias" in raw and "fc_bias" not in raw:  # EAGLE's key for the fc bias
            kwargs["fc_bias"] = bool(raw["bias"])
        if "architecture" not in raw and _is_authors_eagle3(raw):
            kwargs.update(architecture="eagle3", fc_bias=False, feature_layers=kwargs.get("feature_layers", []))
        if kwargs.get("architecture", "eagle2") not in ("eagle2", "eagle3"):
            raise ValueError(f"{path}: architecture {kwargs['architecture']!r} is neither eagle2 nor eagle3")
        return cls(**kwargs)

    def llama_config(self) -> LlamaConfig:
        """The LlamaConfig that sizes the reused HF pieces (MLP, norm, rotary embedding)."""
        rope = {"rope_type": "default", **(self.rope_scaling or {}), "rope_theta": self.rope_theta}
        if "type" in rope and rope.get("rope_type", "default") == "default":
            rope["rope_type"] = rope.pop("type")  # EAGLE-era configs say "type"
        return LlamaConfig(
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            vocab_size=self.vocab_size,
            rms_norm_eps=self.rms_norm_eps,
            max_position_embeddings=self.max_position_embeddings,
            hidden_act=self.hidden_act,
            mlp_bias=False,
            attention_bias=self.attention_bias,
            rope_parameters=rope,
        )


def _is_authors_eagle3(raw: dict) -> bool:
    """An EAGLE-3 config as the EAGLE authors publish it (LlamaForCausalLMEagle3, draft_vocab_size)."""
    return "draft_vocab_size" in raw or any("eagle3" in a.lower() for a in raw.get("architectures") or [])


def _rope_params(cfg) -> dict:
    """Rope settings of a HF config as one flat dict, across transformers 4.x/5.x names."""
    params = dict(getattr(cfg, "rope_parameters", None) or {})
    if not params:
        params = dict(getattr(cfg, "rope_scaling", None) or {})
        params["rope_theta"] = getattr(cfg, "rope_theta", 10000.0)
    if params.get("rope_type", "default") == "default":
        params = {"rope_theta": params.get("rope_theta", 10000.0)}
    return params


KVCache = tuple[torch.Tensor, torch.Tensor]  # ([B, kvH, S, D], [B, kvH, S, D])


class DraftRope:
    """The rotary embedding as a plain attribute, outside the module tree, so that
    `head.to(bfloat16)` never rounds its frequencies; it follows the input's device."""

    def __init__(self, cfg: DraftConfig):
        self.emb = LlamaRotaryEmbedding(cfg.llama_config())

    def __call__(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.emb.inv_freq.device != x.device:
            self.emb.to(x.device)
        return self.emb(x, position_ids)  # cos, sin: [B, S, D]


class DraftAttention(nn.Module):
    """Multi-head attention with grouped KV heads and an explicit, returned KV cache."""

    def __init__(self, cfg: DraftConfig, in_features: int | None = None):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bias = cfg.attention_bias
        d = in_features or cfg.hidden_size  # EAGLE-3 attends over [embedding | feature]: 2H
        self.q_proj = nn.Linear(d, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=bias)

    def forward(
        self,
        x: torch.Tensor,  # [B, S, in_features]
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor | None,  # [B or 1, 1, S, P+S] additive, or None for causal
        past: KVCache | None,
        cache_rows: torch.Tensor | None = None,  # [S]: `past` is preallocated; the new rows go there
    ) -> tuple[torch.Tensor, KVCache]:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)  # [B, nH, S, D]
        k = self.k_proj(x).view(b, s, self.n_kv, self.head_dim).transpose(1, 2)  # [B, kvH, S, D]
        v = self.v_proj(x).view(b, s, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *cos_sin)
        if cache_rows is not None:  # a fixed-shape cache [B, kvH, L, D], written in place; the mask spans L
            past[0].index_copy_(2, cache_rows, k)
            past[1].index_copy_(2, cache_rows, v)
            k, v = past
        elif past is not None:
            k = torch.cat([past[0], k], dim=2)  # [B, kvH, P+S, D]
            v = torch.cat([past[1], v], dim=2)
        causal = mask is None and past is None
        out = attend(q, k, v, None if causal else mask, causal)  # [B, nH, S, D]
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1)), (k, v)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
           causal: bool) -> torch.Tensor:
    """SDPA of q [B, nH, S, D] over grouped k, v [B, kvH, L, D] under the additive mask
    [B or 1, 1, S, L] (or causal): [B, nH, S, D].

    A masked call that autograd records (training-time test, train/unroll.py) gets k and v
    repeated per query head: on a GPU, flash attention takes no mask and the memory-efficient
    kernel no grouped heads, so a masked grouped call would run the math kernel, whose fp32
    scores [B, nH, S, L] stay saved until the backward. The repeated keys and values keep that
    memory linear in L. Calls without autograd (decoding) stay grouped: no copy of the cache.
    """
    grouped = k.shape[1] != q.shape[1]
    if grouped and mask is not None and torch.is_grad_enabled() and q.requires_grad:
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)  # [B, nH, L, D]
        grouped = False
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=grouped)


class DraftLayer(nn.Module):
    """A Llama decoder layer; the first layer of a head has no input norm (its input is `fc`'s
    output), deeper ones do (`norm_input`), as in a Llama stack.

    `residual` is what attention and MLP add to; by default the attention input itself (EAGLE-3
    attends over a wider input than its residual stream, eagle/heads/eagle3.py)."""

    def __init__(self, cfg: DraftConfig, in_features: int | None = None, norm_input: bool = False):
        super().__init__()
        self.norm_input = norm_input
        if norm_input:
            self.input_layernorm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg, in_features)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg.llama_config())

    def forward(self, x, cos_sin, mask, past, residual=None, cache_rows=None):  # [B, S, in] -> [B, S, H]
        residual = x if residual is None else residual
        attn, kv = self.self_attn(self.input_layernorm(x) if self.norm_input else x, cos_sin, mask, past, cache_rows)
        x = residual + attn
        return x + self.mlp(self.post_attention_layernorm(x)), kv


class DraftHead(nn.Module):
    """EAGLE-1/2 head. Construction builds layers only; loading lives in `eagle.heads.checkpoint`."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=cfg.fc_bias)
        self.layers = nn.ModuleList([DraftLayer(cfg, norm_input=i > 0) for i in range(cfg.num_hidden_layers)])
        self._rope = DraftRope(cfg)
        # Target ids the draft may propose, most frequent first ([N] long), or None = all.
        # Saved by eagle.heads.checkpoint in draft_vocab.json (eagle/heads/formats.py), so not part of state_dict().
        self.register_buffer("draft_ids", None, persistent=False)

    def forward(
        self,
        features: torch.Tensor,  # [B, S, H] target features f_t
        token_embeds: torch.Tensor,  # [B, S, H] embeddings of x_{t+1}
        position_ids: torch.Tensor,  # [B, S]
        mask: torch.Tensor | None = None,  # [B or 1, 1, S, P+S] additive; None = causal
        past: KVCache | None = None,
        cache_rows: torch.Tensor | None = None,  # [S]: write into a preallocated `past` [B, layers*kvH, L, D]
    ) -> tuple[torch.Tensor, KVCache]:
        """Return predicted features f̂_{t+1} [B, S, H] and the KV cache extended by S rows
        ([B, layers*kvH, P+S, D] each: the layers' KV heads side by side). With `cache_rows`,
        the rows are written into `past` in place (eagle/compiled/head_graphs.py) and the mask spans L."""
        dtype = self.fc.weight.dtype
        x = self.fc(torch.cat([token_embeds.to(dtype), features.to(dtype)], dim=-1))
        cos_sin = self._rope(x, position_ids)
        if mask is not None:
            mask = mask.to(x.dtype)
        pasts, caches = per_layer(past, len(self.layers)), []
        for layer, layer_past in zip(self.layers, pasts):
            x, kv = layer(x, cos_sin, mask, layer_past, cache_rows=cache_rows)
            caches.append(kv)
        return x, side_by_side(caches)


def per_layer(past: KVCache | None, n: int) -> list[KVCache | None]:
    """Each of `n` layers' (keys, values) [B, kvH, P, D] of a head's cache [B, n*kvH, P, D] (views, so
    writes into a preallocated cache land in it); `past` itself for one layer or without a cache."""
    if past is None or n == 1:
        return [past] * n
    return list(zip(*(t.chunk(n, dim=1) for t in past)))


def side_by_side(caches: list[KVCache]) -> KVCache:
    """The layers' [B, kvH, S, D] caches as one [B, layers*kvH, S, D] each (a one-layer head's as it is)."""
    if len(caches) == 1:
        return caches[0]
    keys, values = zip(*caches)
    return torch.cat(keys, dim=1), torch.cat(values, dim=1)
