"""Weights as int8 codes in pairs of rows, as our GEMV kernel's AVX2 form reads them (eagle/compiled/gemv.py):

    codes, scale = int8_pack(w)               # the draft head's approximate weights (`gemv_int8_linear`)
    codes, scale, slack = screen_pack(w)      # the target's lm_head, screened in greedy steps (`gemv_screened_linear`)

A row's codes q = round(w / s) with s = max|w| / 127, so each weight is within half a step of s q. The kernel
multiplies them by the input rows rounded to 16-bit integers, 16 inputs a chunk (CODE_INPUTS). A greedy step's
screen (eagle/compiled/csrc/gemv_bf16.cpp `screen`) bounds each approximate logit's distance from the exact one by
`slack` (Hoelder's inequality over the weights' and the input row's roundings, plus the fp32 rounding of the exact
sum): every token that may be or tie the largest logit survives it.
"""

from __future__ import annotations

import torch

CODE_INPUTS = 16  # inputs of a code chunk per row (`_mm256_madd_epi16` takes 16 int16 products)
SCREEN_STEP = 0.51  # a rounding's error in steps: half of one, with room for the rounding of w / s and x / s_x
ROUNDING = 3.0 * 2.0 ** -24  # per input: the fp32 rounding of the exact sum, |x|_1 max|w_v| a unit


def int8_pack(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """w [O, I] fp32 as int8 codes in pairs of rows [O/2, I/16, 2, 16] (pair p: for each 16 inputs in turn, row 2p's
    codes, then row 2p + 1's) and each row's scale [O] (its largest |w| / 127; a row of zeros takes 1), the row read
    as scale * codes; None where O is odd or I not a multiple of 16."""
    o, i = w.shape
    if o % 2 or i % CODE_INPUTS:
        return None
    peak = w.abs().amax(dim=1)  # [O]
    scale = torch.where(peak > 0, peak / 127, torch.ones_like(peak))  # [O]
    codes = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)  # [O, I]
    pairs = codes.reshape(o // 2, 2, i // CODE_INPUTS, CODE_INPUTS).permute(0, 2, 1, 3)  # [O/2, I/16, 2, 16]
    return pairs.contiguous(), scale.float().contiguous()


def screen_pack(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """An lm_head w [O, I] fp32 as the screen's codes (eagle/compiled/csrc/gemv_bf16.cpp `screen`): `int8_pack`'s
    codes [O/2, I/16, 2, 16] and scales s [O], and the bounds' slack [2, O]: per unit of an input row's |x|_1, a
    code's rounding (SCREEN_STEP s_v) plus the exact sum's (ROUNDING I max|w_v|); per unit of the row's integer
    scale s_x, its own rounding times the codes' weight (SCREEN_STEP s_v |q_v|_1). None where the packing does not
    take w's shape."""
    packed = int8_pack(w)
    if packed is None:
        return None
    codes, scale = packed
    o, i = w.shape
    mass = codes.float().abs().sum(dim=(1, 3)).reshape(o)  # [O]: |q_v|_1, pairs in row order
    peak = w.abs().amax(dim=1).float()  # [O]
    slack = torch.stack([SCREEN_STEP * scale + ROUNDING * i * peak, SCREEN_STEP * scale * mass])  # [2, O]
    return codes, scale, slack.contiguous()
