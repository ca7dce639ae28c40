"""`python -m evaluation.tau HEAD_DIR`: τ of an exported head on held-back prompts, as the trainer measures it.

The same `train.judge.Judge` the trainer runs every `train.tau_every` steps: greedy decoding of
the first turns of a prompt set with the EAGLE-2 dynamic tree and with a 5-token chain.
"""

from __future__ import annotations

import argparse
import json

import torch

from data_prep.prompt_sets import PROMPT_SETS, held_back_prompts
from eagle.heads.checkpoint import load_head
from eagle.targets.resolve import resolve_target
from train.judge import Judge


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(prog="python -m evaluation.tau", description=__doc__.splitlines()[0])
    ap.add_argument("head", help="exported head directory")
    ap.add_argument("--base", default="smollm2-135m-instruct", help="target: alias, folder or Hub id")
    ap.add_argument("--prompts", default="sharegpt-heldout", help=PROMPT_SETS)
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    judge = Judge.from_target_dir(resolve_target(args.base), held_back_prompts(args.prompts, args.num_prompts),
                                  args.max_new_tokens, dtype)
    metrics = judge.measure(load_head(args.head, dtype=dtype)).metrics()
    print(json.dumps({**vars(args), **metrics}))
    return metrics


if __name__ == "__main__":
    main()
