"""What does the tuned prompt-lookup chain add to the head's tree, on prompts of two kinds?

    python -m experiments.lookup_chain_ab [--head DIR] [--per-category 1] [--sharegpt 8] [--threads 2]

One model with the default settings (`total_token="auto"`, a chain of up to 10 tokens), ready and
compiled, decodes every first turn of MT-bench and of held-out ShareGPT in three ways, one after
the other on each prompt (after an untimed round that compiles every shape):
- `head`: the tuned tree alone (lookup 0);
- `chain`: the tuned tree and chain, merged at every step that finds one (the default);
- `chain-10`: the tuned tree with a 10-token chain.
Prints per prompt set the median tok/s ratio of each against `head`, τ, and whether all outputs agree.
"""

from __future__ import annotations

import statistics
import time

from eagle.decoding.settings import TreeSettings
from eagle.heads.checkpoint import load_head
from eagle.model import EaModel
from experiments.diagnostic_prompts import first_turn_ids, parser, setup

VARIANTS = ("head", "chain", "chain-10")


def decode(model: EaModel, tuned: TreeSettings, variant: str, ids, max_new_tokens: int) -> tuple[float, float, list]:
    """tok/s, τ and the new tokens of one variant of the tuned settings on one prompt."""
    chain = {"head": 0, "chain": tuned.lookup, "chain-10": 10}[variant]
    model.settings = tuned.tuned(tuned.total_token, tuned.depth, chain)
    start = time.perf_counter()
    out = model.eagenerate(ids, max_new_tokens=max_new_tokens)
    seconds = time.perf_counter() - start
    s = model.last_stats
    return s.new_tokens / seconds, s.tau, out[0, ids.shape[1]:].tolist()


def main(argv: list[str] | None = None) -> dict:
    ap = parser(__doc__, "python -m experiments.lookup_chain_ab")
    ap.add_argument("--head", default="checkpoints/eagle-smollm2-135m-instruct")
    ap.set_defaults(per_category=1, sharegpt=8, threads=2)
    args = ap.parse_args(argv)
    tok, target, sets = setup(args)
    model = EaModel.from_modules(target, load_head(args.head, dtype=target.dtype), tok, TreeSettings(lookup=10))
    model.wait_ready()
    model.compile_ahead = False  # every shape compiles in the untimed round below
    tuned = model.settings
    print(f"tuned: {tuned.describe()}", flush=True)
    results = {}
    for name, questions in sets.items():
        prompts = [first_turn_ids(tok, q) for q in questions]
        for ids in prompts:  # untimed: compiles every shape the variants reach
            for v in VARIANTS:
                decode(model, tuned, v, ids, args.max_new_tokens)
        rows = {v: [] for v in VARIANTS}
        for ids in prompts:
            for v in VARIANTS:
                rows[v].append(decode(model, tuned, v, ids, args.max_new_tokens))
        same = sum(len({tuple(rows[v][i][2]) for v in VARIANTS}) == 1 for i in range(len(prompts)))
        print(f"\n{name}: {len(prompts)} prompts x {args.max_new_tokens} tokens, {args.threads} threads; "
              f"all three outputs equal on {same}")
        print("| variant | median tok/s | median ratio to head | τ |\n|---|---|---|---|")
        for v in VARIANTS:
            ratio = statistics.median(r[0] / h[0] for r, h in zip(rows[v], rows["head"]))
            print(f"| {v} | {statistics.median(r[0] for r in rows[v]):.1f} | {ratio:.2f} | "
                  f"{statistics.fmean(r[1] for r in rows[v]):.2f} |")
        results[name] = rows
    return results


if __name__ == "__main__":
    main()
