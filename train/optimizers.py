"""The optimizer of a run (`train.optimizer`): AdamW, or Muon for the head's weight matrices.

- `adamw`: torch's AdamW over every trainable parameter (EAGLE's trainers).
- `muon`: Muon (momentum, then the update orthogonalized by Newton-Schulz) for the 2-D weight
  matrices of fc and the decoder layer; AdamW for the rest (norms, biases, and embedding-like
  matrices: lm_head, embed_tokens), as speculators' EAGLE-3 trainer does by default. It is
  DeepSpeed's Muon (`MuonWithAuxAdam`), which its bf16 and ZeRO optimizers know how to feed
  whole matrices. Step sizes follow torch's `Muon(adjust_lr_fn="match_rms_adamw")`, speculators'
  setting: a [A, B] matrix moves by lr * 0.2 * sqrt(max(A, B)) per unit of orthogonalized update,
  so `train.muon_lr` means what an AdamW lr means; DeepSpeed's update already carries
  sqrt(max(1, A / B)), which the group's lr divides out. Weight decay multiplies by
  1 - muon_lr * muon_weight_decay, as in torch's.
  Its Newton-Schulz runs in bf16 where DeepSpeed's accelerator says bf16 is supported, which its
  CPU accelerator says of every CPU: on one without bf16 arithmetic (AVX2) the head's eight
  matrices took 54 s a step in bf16 against 2.0 s in fp32, two thirds of an EAGLE-3 step. There
  it runs in fp32 (`newton_schulz_dtype`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from eagle.common.precision import native_bf16

ADAMW_NAME_HINTS = ("lm_head", "embed_tokens")  # matrices that stay with AdamW (speculators' and Muon's convention)
OPTIMIZERS = ("adamw", "muon")


def muon_matrix(name: str, p: torch.Tensor) -> bool:
    """Whether Muon (not AdamW) steps parameter `name`: a 2-D matrix, both sides > 1, not vocabulary-sized."""
    return p.ndim == 2 and min(p.shape) > 1 and not any(h in name for h in ADAMW_NAME_HINTS)


def muon_step_scale(shape: torch.Size) -> float:
    """Group lr / muon_lr for a matrix of `shape`: torch's match_rms_adamw factor over DeepSpeed's own."""
    rows, cols = shape
    deepspeed_own = math.sqrt(rows / cols) if rows > cols else 1.0
    return 0.2 * math.sqrt(max(rows, cols)) / deepspeed_own


def build_optimizer(head: nn.Module, t, zero_stage: int = 0) -> torch.optim.Optimizer:
    """The optimizer of `t.optimizer` over `head`'s trainable parameters (`t`: the train config).
    Muon runs at ZeRO stage 0, where two ranks step exactly as one (tests/test_optimizers.py). Under
    ZeRO-2, DeepSpeed 0.19's Muon moved the same matrices 3.6-7x less than at stage 0 from the same
    gradients, so it is refused rather than trusted."""
    named = [(n, p) for n, p in head.named_parameters() if p.requires_grad]
    adamw = dict(lr=t.lr, betas=tuple(t.betas), weight_decay=t.weight_decay)
    if t.optimizer == "adamw":
        return torch.optim.AdamW([p for _, p in named], **adamw)
    if t.optimizer != "muon":
        raise ValueError(f"train.optimizer={t.optimizer!r}: choose one of {', '.join(OPTIMIZERS)}")
    if zero_stage:
        raise ValueError(f"train.optimizer=muon (head=eagle3's default) runs with ZeRO stage 0 (deepspeed=zero0_bf16 "
                         f"or zero0_fp32), not stage {zero_stage}: set train.optimizer=adamw, or deepspeed=zero0_bf16")
    from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam

    newton_schulz_dtype(next(head.parameters()).device)
    muon_lr = t.muon_lr if t.muon_lr is not None else t.lr
    groups = []
    for name, p in named:
        if muon_matrix(name, p):
            scale = muon_step_scale(p.shape)
            groups.append({"params": [p], "use_muon": True, "lr": muon_lr * scale, "momentum": t.muon_momentum,
                           "weight_decay": t.muon_weight_decay / scale, "ns_method": "standard"})
    rest = [p for name, p in named if not muon_matrix(name, p)]
    if rest:
        groups.append({"params": rest, "use_muon": False, "lr": t.lr, "betas": tuple(t.betas), "eps": 1e-8,
                       "weight_decay": t.weight_decay})
    return MuonWithAuxAdam(groups)


def newton_schulz_dtype(device: torch.device) -> torch.dtype:
    """The dtype DeepSpeed's Muon orthogonalizes in for parameters on `device` (its own choice, asked of its
    `ns_compute_dtype`), made fp32 on a CPU without bf16 arithmetic. DeepSpeed's engine still sees its
    accelerator as it is: only the Newton-Schulz precision changes."""
    from deepspeed.runtime.zero.muon import original_muon

    chosen = getattr(original_muon.ns_compute_dtype, "deepspeed_own", original_muon.ns_compute_dtype)
    if device.type == "cpu" and not native_bf16(device):
        def fp32_where_bf16_is_slow(ns_method: str) -> torch.dtype:
            dtype = chosen(ns_method)
            return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype

        fp32_where_bf16_is_slow.deepspeed_own = chosen
        original_muon.ns_compute_dtype = fp32_where_bf16_is_slow
    else:
        original_muon.ns_compute_dtype = chosen
    return original_muon.ns_compute_dtype("standard")
