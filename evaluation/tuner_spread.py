"""`python -m evaluation.tuner_spread --runs 4`: how steady is `total_token="auto"` on this machine?

Tunes the dynamic tree (eagle/tuning/tuner.py) several times in a row on one loaded model and
prints each pick and its expected tokens/s, to see how much the choice moves with the
machine's load. The last pick is what later loads with `total_token="auto"` reuse
(eagle/tuning/budget_cache.py).
"""

from __future__ import annotations

import argparse
import time

import torch

import eagle.decoding.settings as tree_settings
from eagle.tuning.tuner import DEPTHS, SIZES, TreeBudget, describe
from eagle.model import EaModel


def main(argv: list[str] | None = None) -> list[TreeBudget]:
    p = argparse.ArgumentParser(prog="python -m evaluation.tuner_spread", description=__doc__.splitlines()[0])
    p.add_argument("--base", default="smollm2-135m-instruct", help="target: alias, folder or Hub id")
    p.add_argument("--head", default="checkpoints/eagle-smollm2-135m-instruct", help="draft head folder or Hub id")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-compile", action="store_true", help="tune the eager forwards (EaModel(compile=False))")
    tree_settings.add_arguments(p)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = tree_settings.from_arguments(args)
    if settings.auto:  # tuned below, run by run
        settings = settings.tuned(max(SIZES), max(DEPTHS))
    model = EaModel.from_pretrained(args.base, args.head, torch_dtype=getattr(torch, args.dtype), settings=settings,
                                    compile=not args.no_compile, background=False)  # the runs below time alone
    budgets = []
    for run in range(args.runs):
        start = time.perf_counter()
        budgets.append(model.tune(reuse=False))
        print(f"run {run + 1}/{args.runs} ({time.perf_counter() - start:.0f} s): {describe(budgets[-1])}", flush=True)
    picks = [(b.total_token, b.depth, b.lookup) for b in budgets]
    print(f"picks (total_token, depth, lookup): {picks}; expected tok/s "
          f"{', '.join(f'{b.tokens_per_second:.1f}' for b in budgets)}")
    return budgets


if __name__ == "__main__":
    main()
