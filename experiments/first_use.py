"""`python -m experiments.first_use`: a model used the moment it loads, as most users use it.

    python -m experiments.first_use --head checkpoints/eagle3-smollm2-135m-instruct --dtype bfloat16 --threads 2

`EaModel.from_pretrained(target, head)` with its defaults, then `eagenerate` on MT-bench first turns
in a loop, one reply after another with no pause, while the background thread prepares the model
(eagle/tuning/warmup.py). Prints each reply's seconds since the load, tok/s, τ and whether it ran
through the compiled graphs; then the seconds until the first compiled reply and the median tok/s
before and after it. Exits with status 1 when no reply ran compiled within `--seconds`: a model
that stays eager (the background preparation failed) is the failure this looks for.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from data_prep.prompt_sets import held_back_prompts
from train.judge import encode_prompts


def replies(model, prompts: list[torch.Tensor], seconds: float, max_new_tokens: int, start: float) -> list[dict]:
    """One reply after another over `prompts` (cycled) for `seconds` after `start`; a row per reply."""
    rows = []
    while time.perf_counter() - start < seconds:
        model.eagenerate(prompts[len(rows) % len(prompts)], max_new_tokens=max_new_tokens)
        s = model.last_stats
        rows.append({"at_s": round(time.perf_counter() - start, 1), "tok_s": round(s.new_tokens / s.seconds, 1),
                     "tau": round(s.new_tokens / max(s.steps, 1), 2), "compiled": model.runner is model.compiled})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def summary(rows: list[dict]) -> dict:
    """Seconds until the first compiled reply; median tok/s of the replies before it and from it on."""
    first = next((i for i, r in enumerate(rows) if r["compiled"]), None)
    eager = [r["tok_s"] for r in rows[:first]]
    compiled = [r["tok_s"] for r in rows[first:]] if first is not None else []
    return {"replies": len(rows), "compiled_after_s": rows[first]["at_s"] if first is not None else None,
            "eager_tok_s": statistics.median(eager) if eager else None,
            "compiled_tok_s": statistics.median(compiled) if compiled else None}


def main(argv: list[str] | None = None) -> dict:
    from eagle.model import EaModel

    p = argparse.ArgumentParser(prog="python -m experiments.first_use", description=__doc__.splitlines()[0])
    p.add_argument("--base", default="smollm2-135m-instruct")
    p.add_argument("--head", default="checkpoints/eagle3-smollm2-135m-instruct")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="float32: the defaults'")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--prompts", type=int, default=8, help="MT-bench first turns, categories interleaved")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--seconds", type=float, default=180.0, help="how long to keep replying")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    model = EaModel.from_pretrained(args.base, args.head, torch_dtype=getattr(torch, args.dtype))
    prompts = encode_prompts(model.tokenizer, held_back_prompts("mtbench", args.prompts))
    result = summary(replies(model, prompts, args.seconds, args.max_new_tokens, start))
    print(json.dumps(result), flush=True)
    if result["compiled_after_s"] is None:
        sys.exit(f"no reply ran through the compiled graphs within {args.seconds:.0f} s")
    return result


if __name__ == "__main__":
    main()
