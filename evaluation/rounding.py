"""How far bf16 moves the target's choice between its two best tokens: the bound behind the bench's
near-ties (`evaluation.bench.NEAR_TIE_STEPS`).

    python -m evaluation.rounding [--per-category 1] [--max-new-tokens 128] [--threads 2]

Greedy bf16 outputs of two correct decoders can differ: the same logits summed in another order
(a compiled kernel, a tree's batch, a cached step) round differently, and where two tokens are
nearly tied the argmax flips. This measures how far rounding moves the gap between two tokens on
real text. The fp32 target's greedy replies to MT-bench first turns are scored by one causal
forward in fp32 and one in bf16; at every position, for fp32's two best tokens,

    error = |gap in bf16 - gap in fp32|, in rounding steps of bf16 at the largest logit's magnitude

(a step is 0.125 for logits of 16-32). Two bf16 computations can each be that far from fp32, so a
flip between tokens whose bf16 gap is within the error's upper tail is rounding, not a decoding
error. Prints the error's median, 99th percentile and maximum, and the share of positions whose
fp32 gap is itself that small (where flips can happen).
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch

from data_prep.prompt_sets import first_per_category, load_questions
from eagle.targets.resolve import load_target, resolve_target
from eagle.targets.tokenizer import chat_prompt, load_tokenizer


def rounding_steps(logits: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """[P] the spacing of `dtype` at each row's largest |logit| (logits [P, V], any float dtype; an
    all-zero row gets the spacing at the dtype's smallest normal number)."""
    info = torch.finfo(dtype)
    scale = logits.float().abs().amax(dim=-1).clamp(min=info.tiny)  # [P]
    return info.eps * torch.exp2(torch.floor(torch.log2(scale)))


def gap_errors(exact: torch.Tensor, rounded: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position of logits [P, V] in fp32 (`exact`) and bf16 (`rounded`): how far bf16 moves the gap
    between fp32's two best tokens, and fp32's own gap, both in bf16 rounding steps ([P], [P])."""
    exact, rounded = exact.float(), rounded.float()
    top = exact.topk(2, dim=-1).indices  # [P, 2]
    gap = exact.gather(-1, top)  # [P, 2]
    moved = rounded.gather(-1, top)  # [P, 2]
    step = rounding_steps(rounded)  # [P]
    fp32_gap = gap[:, 0] - gap[:, 1]
    return ((moved[:, 0] - moved[:, 1]) - fp32_gap).abs() / step, fp32_gap / step


@torch.inference_mode()
def measure(base: str, per_category: int, max_new_tokens: int) -> dict:
    path = resolve_target(base)
    tokenizer = load_tokenizer(path)
    exact, rounded = load_target(path, torch.float32), load_target(path, torch.bfloat16)
    errors, gaps = [], []
    for q in first_per_category(load_questions("mtbench"), per_category):
        ids = chat_prompt(tokenizer, [{"role": "user", "content": q.turns[0]}])  # [1, S]
        out = exact.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)  # [1, S + n]
        s = ids.shape[1] - 1  # logits at s.. predict the reply's tokens
        error, gap = gap_errors(exact(out).logits[0, s:-1], rounded(out).logits[0, s:-1])
        errors += error.tolist()
        gaps += gap.tolist()
    cut = sorted(errors)
    p99 = cut[min(len(cut) - 1, math.ceil(0.99 * len(cut)) - 1)]
    return {"positions": len(errors), "median_steps": statistics.median(errors), "p99_steps": p99,
            "max_steps": cut[-1], "share_with_fp32_gap_within_p99": sum(g <= p99 for g in gaps) / len(gaps)}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m evaluation.rounding", description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="smollm2-135m-instruct", help="target: alias, folder or Hub id")
    p.add_argument("--per-category", type=int, default=1, help="MT-bench questions per category (first turns)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = measure(args.base, args.per_category, args.max_new_tokens)
    print(f"{result['positions']} positions: bf16 moves the gap between fp32's two best tokens by "
          f"{result['median_steps']:.2f} rounding steps (median), {result['p99_steps']:.2f} (99th percentile), "
          f"{result['max_steps']:.2f} (max); {100 * result['share_with_fp32_gap_within_p99']:.1f} % of positions "
          f"have an fp32 gap within the 99th percentile")
    return result


if __name__ == "__main__":
    main()
