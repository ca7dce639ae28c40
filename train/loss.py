"""The draft losses, over loss-masked pairs only.

EAGLE-1/2 (`eagle_loss`): v_w * SmoothL1(feature) + p_w * token term. EAGLE-3 (`eagle3_loss`):
the token term over the draft vocabulary only, no feature term.

The token term (`train.token_loss`, `token_objective`): `ce`, the cross-entropy against the target's
distribution p (= KL(p || q) up to a constant), or `lk`, -log α with α = Σ_x min(p(x), q(x)), the
probability that a token the draft q samples is accepted at temperature 1 (1 - TV(p, q)): it targets
acceptance itself, where a small head cannot reach q = p and the KL optimum need not be the acceptance
optimum (the LK losses of Samarin et al., 2026). Both report CE as `token_loss` and α as `accept`.

Pairing (see train/data.py): from a padded batch of S rows we form S-1 pairs,
    inputs  f_t = hidden[:, :-1]        tokens x_{t+1} = input_ids[:, 1:]
    target  f_{t+1} = hidden[:, 1:]     counted iff loss_mask[:, 1:]
(EAGLE-3 inputs are the fused layers aux[:, :-1] instead of f_t.) The token term is the
cross-entropy of the draft's distribution against the target's softmax(lm_head(f_{t+1})) as a
soft label. `lm_head` runs only on the masked rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from eagle.decoding.verify import greedy_ids


@dataclass
class Pairs:
    """Model inputs and targets of one batch, already shifted."""

    features: torch.Tensor  # [B, S-1, H] f_t (EAGLE-3: [B, S-1, 3H] its fused layers at t)
    next_ids: torch.Tensor  # [B, S-1] x_{t+1}
    target: torch.Tensor  # [B, S-1, H] f_{t+1}
    mask: torch.Tensor  # [B, S-1] bool, pairs that count
    position_ids: torch.Tensor  # [B, S-1]


def make_pairs(input_ids: torch.Tensor, loss_mask: torch.Tensor, hidden: torch.Tensor,
               inputs: torch.Tensor | None = None) -> Pairs:
    """Shift a batch ([B, S], [B, S], [B, S, H]) into (f_t, x_{t+1}) -> f_{t+1} pairs.

    inputs [B, S, K*H]: the head's input features when they are not `hidden` (EAGLE-3)."""
    b, s = input_ids.shape
    position_ids = torch.arange(s - 1, device=input_ids.device).expand(b, -1)
    return Pairs(
        features=(hidden if inputs is None else inputs)[:, :-1],
        next_ids=input_ids[:, 1:],
        target=hidden[:, 1:],
        mask=loss_mask[:, 1:].bool(),
        position_ids=position_ids,
    )


def uniform_noise(features: torch.Tensor, width: float, ref_len: int | None = None,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """features + U(-width/2, width/2); EAGLE scales width by ref_len / seq_len when ref_len is set."""
    if width <= 0:
        return features
    if ref_len:
        width = width * ref_len / features.shape[1]
    noise = torch.rand(features.shape, generator=generator, dtype=torch.float32, device=features.device)
    return (features.float() + (noise - 0.5) * width).to(features.dtype)


@dataclass
class LossOutput:
    """The scalar to backpropagate plus detached sums for metrics (summable across batches/ranks)."""

    loss: torch.Tensor  # [] weighted total
    feature_loss: torch.Tensor  # [] mean SmoothL1 over masked pairs (and hidden dims)
    token_loss: torch.Tensor  # [] mean soft cross-entropy over masked pairs
    sums: dict[str, torch.Tensor]  # n, feature, token, accept, top1, topk: float64 sums on the loss's device


TOKEN_LOSSES = ("ce", "lk")
SUM_KEYS = ("n", "feature", "token", "accept", "top1", "topk")  # LossOutput.sums


def token_terms(probs: torch.Tensor, logp: torch.Tensor, objective: str,
                metrics: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per row, from the target's probabilities p and the draft's log-probabilities log q ([N, V] each):
    the cross-entropy -Σ p log q and the acceptance α = Σ min(p, q) ([N] each); α carries a gradient
    only when the objective needs it (`ce` keeps no second [N, V] tensor for the backward), and is
    None when neither the objective nor the `metrics` need it."""
    ce = -(probs * logp).sum(-1)
    if objective == "ce" and not metrics:
        return ce, None
    with torch.set_grad_enabled(torch.is_grad_enabled() and objective != "ce"):
        accept = torch.minimum(probs, logp.exp()).sum(-1)
    return ce, accept


def token_objective(kind: str, ce: torch.Tensor, accept: torch.Tensor | None) -> torch.Tensor:
    """The per-row token loss [N] to minimize: `ce`, or `lk` = -log α (its gradient is TV's scaled by
    1/α, so rows the draft misses still pull; α is floored at 1e-6)."""
    if kind == "ce":
        return ce
    if kind == "lk":
        return -torch.log(accept.clamp_min(1e-6))
    raise ValueError(f"train.token_loss={kind!r}: expected one of {TOKEN_LOSSES}")


@dataclass
class VocabTarget:
    """The target's next-token distribution at the masked pairs, restricted to a draft vocabulary."""

    probs: torch.Tensor  # [N, Vd] softmax of the target logits over the draft vocabulary only
    top: torch.Tensor  # [N] the target's argmax over the whole vocabulary (target ids)
    in_vocab: torch.Tensor  # [N] bool: that argmax is in the draft vocabulary (else the row has no loss)


@torch.no_grad()
def vocab_target(target: torch.Tensor, mask: torch.Tensor, lm_head: torch.Tensor, draft_ids: torch.Tensor | None,
                 in_draft: torch.Tensor | None) -> VocabTarget:
    """From target features f_{t+1} [B, S, H], mask [B, S], the full lm_head [V, H], the draft
    vocabulary (target ids [Vd], None = all) and its membership [V] bool."""
    logits = target[mask].to(lm_head.dtype) @ lm_head.T  # [N, V]
    top = greedy_ids(logits)
    in_vocab = torch.ones_like(top, dtype=torch.bool) if in_draft is None else in_draft[top]
    restricted = logits if draft_ids is None else logits[:, draft_ids]  # [N, Vd]
    return VocabTarget(torch.softmax(restricted.float(), dim=-1), top, in_vocab)


def eagle_loss(
    pred: torch.Tensor,  # [B, S, H] predicted features f̂_{t+1}
    target: torch.Tensor,  # [B, S, H] target features f_{t+1}
    mask: torch.Tensor,  # [B, S] bool
    lm_head: torch.Tensor,  # [V, H] frozen lm_head weight (or the draft vocabulary's rows)
    v_w: float = 1.0,
    p_w: float = 0.1,
    topk: int = 3,
    step: int = 0,
    dist: VocabTarget | None = None,
    objective: str = "ce",
    metrics: bool = True,
) -> LossOutput:
    """EAGLE's loss over the masked pairs of unrolled pass `step` (see pass_mask). `dist`: the
    target's distribution over `mask`'s rows (vocab_target), computed once and shared by the
    passes; None computes it here. With no pair the loss is 0 (still differentiable). Without
    `metrics` the sums are zeros and α and top-k over [N, V] are skipped: the trainer reports the first
    pass's only.

    Every masked row is scored and the pass's rows are weighed in (`keep`), so the backward keeps
    `dist.probs` itself rather than a per-pass copy of its rows."""
    keep = pass_mask(mask, step)[mask]  # [N] rows with a whole draft chain behind them
    n = int(keep.sum())
    if n == 0:
        return _no_pairs(pred)
    pred_m = pred[mask]  # [N, H]
    weight = keep.to(torch.float32) / n  # [N]: the mean over the pass's rows
    target_m = target[mask].to(pred_m.dtype)  # [N, H]
    per_row = F.smooth_l1_loss(pred_m.float(), target_m.float(), reduction="none").mean(-1)  # [N]
    feature_loss = (per_row * weight).sum()  # mean over n*H
    lm = lm_head.to(pred_m.dtype)
    dist = dist or vocab_target(target, mask, lm, None, None)
    draft_logits = pred_m @ lm.T  # [N, V]
    draft_logp = torch.log_softmax(draft_logits.float(), dim=-1)
    ce, accept = token_terms(dist.probs, draft_logp, objective, metrics)  # [N] each
    token_loss = (ce * weight).sum()
    loss = v_w * feature_loss + p_w * (token_objective(objective, ce, accept) * weight).sum()
    if not metrics:
        return LossOutput(loss, feature_loss.detach(), token_loss.detach(), _zero_sums(pred.device))
    with torch.no_grad():
        draft_top = draft_logits.topk(min(topk, draft_logits.shape[-1]), dim=-1).indices[keep]  # [n, k]
        hits = draft_top == dist.top[keep][:, None]
        sums = {
            "n": torch.full((), float(n), dtype=torch.float64, device=pred.device),
            "feature": feature_loss.detach().double() * n,
            "token": token_loss.detach().double() * n,
            "accept": accept.detach()[keep].sum().double(),
            "top1": hits[:, 0].sum().double(),
            "topk": hits.any(-1).sum().double(),
        }
    return LossOutput(loss, feature_loss.detach(), token_loss.detach(), sums)


def pass_mask(mask: torch.Tensor, step: int) -> torch.Tensor:
    """The loss rows of unrolled pass `step`: `mask` [B, S] without the first `step` columns
    (their draft chain would start before position 0, see train/unroll.py)."""
    if step == 0:
        return mask
    keep = torch.arange(mask.shape[1], device=mask.device) >= step
    return mask & keep


def _no_pairs(pred: torch.Tensor, *scored: torch.Tensor) -> LossOutput:
    """The loss of a batch without masked pairs: 0, still differentiable (through `pred` and what was
    `scored` of it), zero sums."""
    zero = sum((t.sum() for t in scored), pred.sum()) * 0.0
    return LossOutput(zero, zero.detach(), zero.detach(), _zero_sums(pred.device))


def _zero_sums(device: torch.device) -> dict[str, torch.Tensor]:
    return {k: torch.zeros((), dtype=torch.float64, device=device) for k in SUM_KEYS}


def eagle3_loss(logits_of, pred: torch.Tensor, mask: torch.Tensor, target: VocabTarget, step: int = 0,
                draft_ids: torch.Tensor | None = None, topk: int = 3, objective: str = "ce",
                metrics: bool = True) -> LossOutput:
    """EAGLE-3's token loss for the head states `pred` [B, S, H] of unrolled pass `step`.

    logits_of: head states [N, H] -> draft-vocabulary logits [N, Vd] (the head's norm + lm_head).
    The token term (`objective`) against `target.probs` over rows whose target argmax is in the draft
    vocabulary; top-1 and α count every row (a target token outside the vocabulary is a miss; α is
    taken against p restricted to the draft vocabulary).

    Every masked row is scored and the pass's rows are weighed in, so the backward keeps
    `target.probs` itself, not a per-pass copy of its rows; and `logits_of` runs once per pass on
    every rank, even on one without pairs (a ZeRO-3 engine gathers its weights collectively).
    Without `metrics` the sums are zeros (see eagle_loss)."""
    keep = pass_mask(mask, step)[mask]  # [N] rows with a whole draft chain behind them
    logp = torch.log_softmax(logits_of(pred[mask]).float(), dim=-1)  # [N, Vd]
    n = int(keep.sum())
    if n == 0:
        return _no_pairs(pred, logp)
    counted = keep & target.in_vocab  # [N]
    ce, accept = token_terms(target.probs, logp, objective, metrics)  # [N] each
    rows = counted.sum().clamp(min=1)
    token_loss = (ce * counted).sum() / rows
    loss = (token_objective(objective, ce, accept) * counted).sum() / rows
    zero = torch.zeros((), dtype=torch.float64, device=pred.device)  # EAGLE-3 has no feature term
    if not metrics:
        return LossOutput(loss, zero, token_loss.detach(), _zero_sums(pred.device))
    with torch.no_grad():
        draft_top = logp.topk(min(topk, logp.shape[-1]), dim=-1).indices[keep]  # [n, k] draft ids
        if draft_ids is not None:
            draft_top = draft_ids[draft_top]
        hits = draft_top == target.top[keep][:, None]
        sums = {"n": torch.full((), float(n), dtype=torch.float64, device=pred.device), "feature": zero,
                "token": token_loss.detach().double() * n, "accept": accept.detach()[keep].sum().double(),
                "top1": hits[:, 0].sum().double(), "topk": hits.any(-1).sum().double()}
    return LossOutput(loss, zero, token_loss.detach(), sums)


def summarize(sums: dict[str, torch.Tensor], topk: int = 3) -> dict[str, float]:
    """Means from summed statistics: feature_loss, token_loss, accept, top1, top{k}."""
    n = float(sums["n"])
    if n == 0:
        return {}
    return {
        "feature_loss": float(sums["feature"]) / n,
        "token_loss": float(sums["token"]) / n,
        "accept": float(sums["accept"]) / n,
        "top1": float(sums["top1"]) / n,
        f"top{topk}": float(sums["topk"]) / n,
    }
