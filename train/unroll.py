"""Training-time test: train the head on its own predictions, as it is used when drafting.

At inference the head drafts depth d+1 from its own depth-d output: the row at position j
takes the *predicted* feature f̂_j and attends to committed rows (true features) up to
j-d plus its own chain of draft rows. Plain EAGLE training only ever shows it true
features, so errors compound with depth (the gap HASS and EAGLE-3's training-time test
close). `unrolled_forward` runs the head `steps` times over a batch:

    pass 0: rows j take (f_j, x_{j+1})                  keys K0 (true features)
    pass i: rows j take (f̂ⁱ⁻¹_j, x_{j+1}), where f̂ⁱ⁻¹_j = pass i-1's output at row j-1
            row j attends to K0[0 .. j-i] and K1[j-i+1], K2[j-i+2], ..., Ki[j]

which is exactly the attention of a depth-(i+1) draft row at inference. Each pass's output
is trained against the same targets f_{j+1}; later passes weigh `decay**i`.
"""

from __future__ import annotations

import torch


def unroll_mask(seq: int, step: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """Additive mask [1, 1, S, (step+1)*S] for pass `step` (>= 1) over keys [K0 | K1 | ... | Kstep].

    Query row j may see K0 rows p <= j - step, and in segment s >= 1 only row j - step + s.
    """
    j = torch.arange(seq, device=device)[:, None]  # [S, 1]
    p = torch.arange(seq, device=device)[None, :]  # [1, S]
    blocks = [p <= j - step] + [p == j - step + s for s in range(1, step + 1)]  # each [S, S]
    allowed = torch.cat(blocks, dim=1)  # [S, (step+1)*S]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def shift_predictions(pred: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """Next pass's input features: row j gets pred[j-1]; row 0 keeps `first`. [B, S, H]

    Rows j < pass have no draft chain behind them (it would start before position 0): the
    loss skips them (`train.loss.pass_mask`), and no row j >= pass attends to them, so `first` only
    has to have the right width: the true feature (EAGLE-1/2) or, for an EAGLE-3 head whose
    inputs are 3H wide, its own output."""
    return torch.cat([first[:, :1], pred[:, :-1]], dim=1)


def unrolled_forward(head, features: torch.Tensor, embeds: torch.Tensor, position_ids: torch.Tensor,
                     steps: int, detach: bool = True) -> list[torch.Tensor]:
    """Outputs of `steps` passes ([B, S, H] each), pass 0 first; `head` is a draft head (or its engine).

    features [B, S, H] are the (noised) true features f_j (EAGLE-3: the fused layers, [B, S, 3H]),
    embeds [B, S, H] those of x_{j+1}.
    With detach, a pass's inputs carry no gradient into the previous pass (as at inference).
    """
    pred, past = head(features, embeds, position_ids)
    outputs = [pred]
    first = features if features.shape[-1] == pred.shape[-1] else pred.detach()
    for step in range(1, steps):
        inputs = shift_predictions(pred.detach() if detach else pred, first)
        mask = unroll_mask(features.shape[1], step, pred.dtype, pred.device)
        pred, past = head(inputs.to(features.dtype), embeds, position_ids, mask, past)
        outputs.append(pred)
    return outputs
