"""Does the gated prompt-lookup chain (eagle/decoding/lookup_gate.py) ever decode slower than the head alone?

    python -m experiments.lookup_gate_ab [--head DIR] [--per-category 1] [--sharegpt 8] [--threads 2]

One model with the default settings (`total_token="auto"`, a chain of up to 10 tokens), ready and
compiled, decodes every first turn of MT-bench and of held-out ShareGPT in four ways, one after
the other on each prompt (after an untimed round that compiles every shape):
- `head`: the tuned tree alone (lookup 0);
- `gated`: the tuned tree and chain, the chain merged only while it pays (the default);
- `always`: the same chain merged at every step (a chain set by hand);
- `always-10`: a 10-token chain at every step (the default before the gate).
Prints per prompt set the median tok/s ratio of each against `head`, τ, and the share of steps
that had a chain merged.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

from eagle.decoding.settings import TreeSettings
from eagle.heads.checkpoint import load_head
from eagle.model import EaModel
from experiments.diagnostic_prompts import first_turn_ids, parser, setup

VARIANTS = ("head", "gated", "always", "always-10")


def decode(model: EaModel, tuned, variant: str, ids, max_new_tokens: int) -> tuple[float, float, float, list]:
    """tok/s, τ and chain share of one variant on one prompt."""
    n, d, lookup = tuned.settings.total_token, tuned.settings.depth, tuned.settings.lookup
    chain = {"head": 0, "gated": lookup, "always": lookup, "always-10": 10}[variant]
    model.settings = tuned.settings.tuned(n, d, chain)
    model.tuning = tuned.tuning if variant == "gated" else None  # no tuning: the chain is merged at every step
    start = time.perf_counter()
    out = model.eagenerate(ids, max_new_tokens=max_new_tokens)
    seconds = time.perf_counter() - start
    s = model.last_stats
    return s.new_tokens / seconds, s.tau, s.chain_steps / max(1, s.steps), out[0, ids.shape[1]:].tolist()


def main(argv: list[str] | None = None) -> dict:
    ap = parser(__doc__, "python -m experiments.lookup_gate_ab")
    ap.add_argument("--head", default="checkpoints/eagle-smollm2-135m-instruct")
    ap.set_defaults(per_category=1, sharegpt=8, threads=2)
    args = ap.parse_args(argv)
    tok, target, sets = setup(args)
    model = EaModel.from_modules(target, load_head(args.head, dtype=target.dtype), tok, TreeSettings(lookup=10))
    model.wait_ready()
    model.compile_ahead = False  # every shape compiles in the untimed round below
    tuned = type("Tuned", (), {"settings": model.settings, "tuning": model.tuning})
    print(f"tuned: {model.settings.describe()}; chain cost {model.tuning.chain_cost()}", flush=True)
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
        same = sum(len({tuple(rows[v][i][3]) for v in VARIANTS}) == 1 for i in range(len(prompts)))
        print(f"\n{name}: {len(prompts)} prompts x {args.max_new_tokens} tokens, {args.threads} threads; "
              f"all four outputs equal on {same}")
        print("| variant | median tok/s | median ratio to head | τ | steps with a chain |\n|---|---|---|---|---|")
        for v in VARIANTS:
            ratio = statistics.median(r[0] / h[0] for r, h in zip(rows[v], rows["head"]))
            print(f"| {v} | {statistics.median(r[0] for r in rows[v]):.1f} | {ratio:.2f} | "
                  f"{statistics.fmean(r[1] for r in rows[v]):.2f} | {statistics.fmean(r[2] for r in rows[v]):.2f} |")
        results[name] = rows
    return results


if __name__ == "__main__":
    main()
