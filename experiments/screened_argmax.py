"""Can greedy decoding read a quantized copy of the target's lm_head and still pick exactly its argmax?

    python -m experiments.screened_argmax [--per-category 2] [--sharegpt 16] [--humaneval 16] [--max-new-tokens 128]

A greedy step needs only the argmax of the logits h·w_v over the vocabulary, and the lm_head is a fifth of
SmolLM2-135M's bytes, read at every target forward. With a quantized copy q_v of each row (per group of G inputs
a scale s, values round(w / s) in [-Q, Q]), Hölder's inequality bounds each approximate logit's error:

    |h·w_v - h·q_v| <= sum over groups g of ||h_g||_1 * max_i |w_v,i - q_v,i|  <=  sum_g ||h_g||_1 * s_v,g / 2

Every token whose approximate logit plus its bound is below the largest approximate logit minus its own bound
cannot be the argmax; the others (the candidates) are scored exactly from the weight's own rows, and their argmax
is the argmax of all. The bounds also carry the fp32 rounding bounds of both 576-term dot products (`ROUNDING`),
so the candidates hold the argmax of the logits as any summation order computes them.

This decodes the greedy text of each prompt (HF eager, fp32), takes the final hidden state at every position of
its reply, and prints for each quantization how many candidates a position keeps (that the exact argmax is
among them is asserted) and the bytes a greedy forward would read of the lm_head: the quantized copy with its
scales, plus the candidates' exact rows. Then, on the first prompt set, the int8 screen with the rows x rounded
too (to 16, 12, 8 or 7 bits, the channels of largest mean |x| kept in fp32 or not), for integer products. Greedy
decoding is deterministic, so these figures do not depend on the machine's load.

`--time` (AVX2 CPUs without bf16 arithmetic; a quiet machine) also checks that the decoder's screened lm_head
(eagle/compiled/int8_codes.py `screen_pack`, `eagle::gemv_screened_linear`: int8 rows, the rows x as 16-bit integers for
integer products) picks the exact argmax at every recorded position, and times it against the same op unscreened
(the fp32 kind's GEMV over bf16 rows), median ms of `--rounds` calls at 1, 2, 4 and 8 rows: hot (the weights in the
caches, as the prototype was timed) and cold (64 MB written between calls, as a forward's other weights evict them).
"""

from __future__ import annotations

import torch

from data_prep.prompt_sets import load_questions
from eagle.compiled import gemv, int8_codes
from evaluation.thread_teams import median_ms
from experiments.diagnostic_prompts import first_turn_ids, parser, setup

SCHEMES = (("int8, one scale a row", 8, None), ("int8, groups of 64", 8, 64), ("int4, groups of 64", 4, 64),
           ("int4, groups of 32", 4, 32), ("int4, groups of 16", 4, 16))
INPUTS = ((16, 0), (12, 0), (8, 0), (8, 32), (7, 32))  # (bits of the rows x, their largest channels kept in fp32)
ROUNDING = int8_codes.ROUNDING  # per term, times the dot product's length: the sums' fp32 rounding


def quantize(w: torch.Tensor, bits: int, group: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """w [V, H] as symmetric integers q [V, H] (in a float tensor) and scales s [V, H/G] (G = H for None)."""
    v, h = w.shape
    g = group or h
    blocks = w.reshape(v, h // g, g)
    scale = blocks.abs().amax(-1) / (2 ** (bits - 1) - 1)  # [V, H/G]
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(blocks / scale[..., None])
    return q.reshape(v, h), scale


def candidates(hidden: torch.Tensor, w: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """[M, V] bool: the tokens a screen by the quantized rows keeps for hidden states [M, H]."""
    m, h = hidden.shape
    groups = scale.shape[1]
    dequant = (q.reshape(q.shape[0], groups, -1) * scale[..., None]).reshape(q.shape)  # [V, H]
    approx = hidden @ dequant.T  # [M, V]
    l1 = hidden.abs().reshape(m, groups, -1).sum(-1)  # [M, G]
    bound = l1 @ (scale / 2).T  # [M, V] quantization
    bound += h * ROUNDING * hidden.abs().sum(-1, keepdim=True) * w.abs().amax(-1)[None]  # fp32 rounding
    return screen(approx, bound)


def screen(approx: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """[M, V] bool: the tokens whose upper end reaches the best lower end (approximate logits ± bounds [M, V])."""
    return approx + bound >= (approx - bound).amax(-1, keepdim=True)


def rounded_inputs(hidden: torch.Tensor, w: torch.Tensor, q: torch.Tensor, s: torch.Tensor, bits: int,
                   apart: int) -> torch.Tensor:
    """The int8 screen (rows q [V, H], scales s [V]) with the rows x [M, H] rounded too: to `bits`-bit integers,
    one scale a row, but for the `apart` channels of largest mean |x| here, kept in fp32. Their rounding joins
    the bound (s_x / 2 * s_v |q_v|_1). [M, V] bool."""
    order = hidden.abs().mean(0).argsort(descending=True)
    kept_apart, rest = order[:apart], order[apart:]
    sx = hidden[:, rest].abs().amax(1, keepdim=True) / (2 ** (bits - 1) - 1)  # [M, 1]
    k = torch.round(hidden[:, rest] / sx)
    approx = (k @ q[:, rest].T) * sx * s[None] + hidden[:, kept_apart] @ (q[:, kept_apart] * s[:, None]).T
    per_l1, per_sx = row_bounds(w, q[:, rest], s)
    bound = hidden.abs().sum(1, keepdim=True) * per_l1[None] + sx * per_sx[None] + 1e-6 * approx.abs()
    return screen(approx, bound)


def row_bounds(w: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token [V], for int8 rows q (of the rounded inputs' channels) with scales s [V]: the bound per unit of
    |x|_1 (half the scale, and the fp32 rounding of w [V, H]'s sums) and per unit of the inputs' own scale s_x
    (s_v |q_v|_1 / 2)."""
    return (s / 2 + w.shape[1] * ROUNDING * w.abs().amax(-1)).contiguous(), (s * q.abs().sum(-1) / 2).contiguous()


def decoder_screen(w: torch.Tensor):
    """`call(x, greedy)`: the decoder's lm_head op over w [V, H] (screening where `greedy`); None where the CPU
    does not screen (`gemv.screens()`: AVX2 without bf16 arithmetic, the kernel built)."""
    if not gemv.screens():
        return None
    w16, packed, full = gemv.pack(w.bfloat16()), int8_codes.screen_pack(w), w.t()

    def call(x: torch.Tensor, greedy: bool) -> torch.Tensor:
        with gemv.screened_argmax(greedy):
            return torch.ops.eagle.gemv_screened_linear(x, w16, *packed, 16, 16, full)
    return call


def time_screen(w: torch.Tensor, states: dict[str, torch.Tensor], rounds: int) -> None:
    """Check the decoder's screened argmax at every recorded position, then time it against the op unscreened."""
    call = decoder_screen(w)
    if call is None:
        print("--time needs an AVX2 CPU without bf16 arithmetic and the GEMV kernel built")
        return
    for name, hidden in states.items():
        for row in hidden.split(8):
            assert torch.equal(call(row.contiguous(), True).argmax(-1), call(row.contiguous(), False).argmax(-1)), name
    hidden = next(iter(states.values()))
    evict = torch.empty(64 << 20, dtype=torch.uint8)
    print("| rows | threads | unscreened ms, hot | screened, hot | unscreened ms, cold | screened, cold |")
    print("|---|---|---|---|---|---|")
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for m in (1, 2, 4, 8):
            x = hidden[:m].contiguous()
            hot = [_warm_median_ms(lambda g=g: call(x, g), rounds) for g in (False, True)]
            cold = [_warm_median_ms(lambda g=g: call(x, g), rounds, lambda: evict.add_(1)) for g in (False, True)]
            print(f"| {m} | {threads} | {hot[0]:.2f} | {hot[1]:.2f} ({hot[1] / hot[0]:.2f}) | {cold[0]:.2f} "
                  f"| {cold[1]:.2f} ({cold[1] / cold[0]:.2f}) |")


def _warm_median_ms(call, rounds: int, before=None) -> float:
    """The median ms of `rounds` calls after 3 unmeasured ones (`before` ahead of each, untimed)."""
    for _ in range(3):
        call()
    return median_ms(call, rounds, before)


def reply_hidden(model, tok, question, max_new_tokens: int) -> torch.Tensor:
    """Final hidden states [T, H] at the positions whose logits chose the greedy reply's tokens."""
    ids = first_turn_ids(tok, question)
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        hidden = model.model(out).last_hidden_state[0]  # [S, H]
    return hidden[ids.shape[1] - 1:out.shape[1] - 1]


def _counts(kept: torch.Tensor, hidden: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Candidates per row [M] of a screen's kept [M, V], after checking that it holds the exact argmax."""
    exact = (hidden @ w.T).argmax(-1)
    assert bool(kept[torch.arange(len(hidden)), exact].all()), "a screen dropped the argmax"
    return kept.sum(-1).float()


def weights_table(w: torch.Tensor, states: dict[str, torch.Tensor]) -> None:
    """Candidates and bytes read for each quantization of the rows (`SCHEMES`), per prompt set."""
    full_bytes = w.numel() * 2  # bf16 rows
    print("| scheme | set | candidates median / mean / p99 / max | MB read (copy + mean candidates' rows) | share |")
    print("|---|---|---|---|---|")
    for label, bits, group in SCHEMES:
        q, scale = quantize(w, bits, group)
        copy_bytes = w.numel() * bits / 8 + scale.numel() * 2
        for name, hidden in states.items():
            n = _counts(candidates(hidden, w, q, scale), hidden, w)
            read = copy_bytes + float(n.mean()) * w.shape[1] * 2
            print(f"| {label} | {name} | {n.median():.0f} / {n.mean():.1f} / {n.quantile(0.99):.0f} / {n.max():.0f} "
                  f"| {read / 1e6:.1f} | {read / full_bytes:.2f} |")


def inputs_table(w: torch.Tensor, states: dict[str, torch.Tensor]) -> None:
    """Candidates of the int8 screen when the rows x are rounded too (`INPUTS`), on the first prompt set; and how
    far a row's largest |x| stands above its mean."""
    name, hidden = next(iter(states.items()))
    spread = (hidden.abs().amax(1) / hidden.abs().mean(1)).median()
    print(f"{name}: a row's largest |x| is {spread:.1f}x its mean (median over rows)")
    print("| x bits | channels kept in fp32 | candidates median / mean / p99 / max |")
    print("|---|---|---|")
    q, scale = quantize(w, 8, None)
    for bits, apart in INPUTS:
        n = _counts(rounded_inputs(hidden, w, q, scale[:, 0], bits, apart), hidden, w)
        print(f"| {bits} | {apart} | {n.median():.0f} / {n.mean():.1f} / {n.quantile(0.99):.0f} / {n.max():.0f} |")


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__, "python -m experiments.screened_argmax")
    ap.add_argument("--humaneval", type=int, default=16, help="HumanEval problems")
    ap.add_argument("--time", action="store_true", help="time the int8 prototype against the bf16 GEMV")
    ap.add_argument("--rounds", type=int, default=50)
    args = ap.parse_args(argv)
    tok, model, sets = setup(args)
    model = model.float()  # fp32 of the checkpoint's bf16 values, as decoding runs on a CPU without bf16
    if args.humaneval:
        sets["humaneval"] = load_questions("humaneval")[: args.humaneval]
    w = model.lm_head.weight.detach()  # [V, H]
    states = {name: torch.cat([reply_hidden(model, tok, q, args.max_new_tokens) for q in questions])
              for name, questions in sets.items()}
    print(f"lm_head {tuple(w.shape)}: {w.numel() * 2 / 1e6:.1f} MB in bf16; positions: "
          + ", ".join(f"{name} {len(h)}" for name, h in states.items()))
    weights_table(w, states)
    inputs_table(w, states)
    if args.time:
        time_screen(w, states, args.rounds)


if __name__ == "__main__":
    main()
