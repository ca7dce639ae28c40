"""The EAGLE-3 draft head (Li et al., 2025): fused multi-layer features, its own lm_head.

Differences from the EAGLE-1/2 head (eagle/heads/eagle2.py):
- the input feature g_t = fc([l_t | m_t | h_t]) fuses three target layers (low, middle,
  high: hidden_states[2], [N//2], [N-3] of an N-layer target by default, eagle/heads/feature_layers.py),
  Linear(3H -> H);
- the decoder layer attends over [norm(embedding of x_{t+1}) | norm(g_t)] (2H wide) and
  adds its output to g_t: a_t = g_t + attn + mlp, an internal state, not a target feature;
- the draft distribution is `lm_head(norm(a_t))` over a *draft vocabulary* of Vd frequent
  target tokens (`draft_ids`, saved as d2t/t2d); nothing of the target is reused;
- deeper drafts feed a_t back in place of g_t (no fc): `forward` fuses only 3H-wide inputs.

EAGLE-3's heads have one decoder layer; `num_hidden_layers` = n > 1 stacks n - 1 plain Llama layers
(`layers.1` ... `layers.{n-1}`, each over the state alone, H wide) on top of it, as vLLM's EAGLE-3 model
stacks them, so a_t is the last layer's output. Their KV caches sit side by side like an EAGLE-1/2
head's ([B, n*kvH, S, D], eagle/heads/eagle2.py).

speculators trains by default a variant (DraftConfig's `norm_before_fc`, `norm_before_residual`,
`norm_output`): an RMSNorm on the fused input before fc (`input_norm`), the layer adding to the
normed feature, and a_t normed once by `norm` so that the state fed back is norm(a_t). The flags
travel in config.json and are read from speculators' config, so its heads decode here unchanged.

Parameter names follow the EAGLE authors' released checkpoints (`fc`, `midlayer.*`, `norm`,
`lm_head`), so their heads load into this class unchanged.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from eagle.heads.eagle2 import DraftConfig, DraftLayer, DraftRope, KVCache, per_layer, side_by_side


class Eagle3Layer(DraftLayer):
    """The draft decoder layer with attention over [norm(embedding) | norm(feature)] (2H wide),
    adding to the un-normed feature."""

    def __init__(self, cfg: DraftConfig):
        super().__init__(cfg, in_features=2 * cfg.hidden_size)
        self.hidden_norm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.input_layernorm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

        self.norm_before_residual = cfg.norm_before_residual

    def forward(self, hidden, embeds, cos_sin, mask, past, cache_rows=None):  # [B, S, H] x2 -> [B, S, H]
        normed = self.hidden_norm(hidden)
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)  # [B, S, 2H]
        residual = normed if self.norm_before_residual else hidden
        return super().forward(x, cos_sin, mask, past, residual=residual, cache_rows=cache_rows)


class Eagle3Head(nn.Module):
    """EAGLE-3 head. `forward` gives the state a_t; `logits` the draft-vocabulary scores."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        if not cfg.draft_vocab_size:
            raise ValueError("an EAGLE-3 head needs draft_vocab_size (the rows of its lm_head)")
        if cfg.num_hidden_layers < 1:
            raise ValueError(f"an EAGLE-3 head has at least one decoder layer, got num_hidden_layers={cfg.num_hidden_layers}")
        self.config = cfg
        h, n_layers = cfg.hidden_size, len(cfg.feature_layers) or 3
        if n_layers < 2:  # `forward` tells fused inputs from its own states by their width
            raise ValueError(f"an EAGLE-3 head fuses several layers, got feature_layers={cfg.feature_layers}")
        # speculators' variant: one RMSNorm over the fused [3H] input (absent from EAGLE's published heads)
        self.input_norm = LlamaRMSNorm(n_layers * h, eps=cfg.rms_norm_eps) if cfg.norm_before_fc else None
        self.fc = nn.Linear(n_layers * h, h, bias=False)
        self.midlayer = Eagle3Layer(cfg)
        # layers 1 .. n-1 (none in EAGLE-3's published heads): Llama layers over the state alone
        self.layers = nn.ModuleDict({str(i): DraftLayer(cfg, norm_input=True) for i in range(1, cfg.num_hidden_layers)})
        self.norm = LlamaRMSNorm(h, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
        self._rope = DraftRope(cfg)
        # Target id of each lm_head row ([Vd] long), or None when Vd is the whole vocabulary.
        self.register_buffer("draft_ids", None, persistent=False)

    def forward(
        self,
        features: torch.Tensor,  # [B, S, 3H] target layers, or [B, S, H] the head's own earlier states
        token_embeds: torch.Tensor | None = None,  # [B, S, H] embeddings of x_{t+1}
        position_ids: torch.Tensor | None = None,  # [B, S]
        mask: torch.Tensor | None = None,  # [B or 1, 1, S, P+S] additive; None = causal
        past: KVCache | None = None,
        cache_rows: torch.Tensor | None = None,  # [S]: write into a preallocated `past` (eagle/heads/eagle2.py)
        logits_only: bool = False,
    ) -> tuple[torch.Tensor, KVCache] | torch.Tensor:
        """Return the states a_t [B, S, H] and the KV cache extended by S rows.

        logits_only: `features` are head states [..., H]; return their draft-vocabulary logits
        (`logits`). The trainer scores its token loss this way, through the forward of its DeepSpeed
        engine, where ZeRO-3 has the partitioned weights gathered."""
        if logits_only:
            return self.logits(features)
        dtype = self.fc.weight.dtype
        hidden = features.to(dtype)
        if hidden.shape[-1] == self.fc.in_features:
            hidden = self.fc(hidden if self.input_norm is None else self.input_norm(hidden))
        cos_sin = self._rope(hidden, position_ids)
        if mask is not None:
            mask = mask.to(dtype)
        pasts = per_layer(past, self.config.num_hidden_layers)
        state, kv = self.midlayer(hidden, token_embeds.to(dtype), cos_sin, mask, pasts[0], cache_rows)
        caches = [kv]
        for layer, layer_past in zip(self.layers.values(), pasts[1:]):
            state, kv = layer(state, cos_sin, mask, layer_past, cache_rows=cache_rows)
            caches.append(kv)
        return (self.norm(state) if self.config.norm_output else state), side_by_side(caches)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [..., Vd] of states [..., H] (`forward`'s output)."""
        return self.lm_head(self.scorer_norm(hidden))

    def scorer_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """What lm_head reads of a state: norm(a_t), or the state itself when `forward` already normed it
        (`norm_output`)."""
        return hidden if self.config.norm_output else self.norm(hidden)
