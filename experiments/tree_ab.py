"""How fast do fixed tree and chain settings decode, against plain decoding and the tuner's pick, in one run?

    python -m experiments.tree_ab [--head DIR] [--configs tuned,tuned+0,2/1+6,4/2+4,8/4+0] [--per-category 1]
                                  [--sharegpt 0] [--humaneval 16] [--threads 2]

One model with the default settings (`total_token="auto"`, a chain of up to 10 tokens), ready and compiled,
decodes every first turn of each prompt set with plain steps and with each configuration, one after the other
on each prompt, after an untimed pass over the first four prompts and the longest one that compiles every shape
(a head width first met later compiles its graph, seconds each, which would otherwise land in one timed
prompt). A configuration
is `N/D+L` (N nodes, depth D, an L-token chain merged at every step that finds one), `tuned` (the tuner's
pick), or `tuned+L` (the tuned tree with an L-token chain; `tuned+0`: the head's tree alone). Prints per set
and configuration the median over prompts of its tok/s against plain decoding's on the same prompt (a typical
prompt), its tok/s over all prompts together against plain decoding's (the bench's measure: prompts that copy
much weigh in with their speed), the mean τ, the median ms of a step after the prefill, and how many prompts'
outputs equal plain decoding's.
"""

from __future__ import annotations

import statistics
import time

import torch

from data_prep.prompt_sets import load_questions
from eagle.decoding.settings import TreeSettings
from eagle.heads.checkpoint import load_head
from eagle.model import EaModel
from experiments.diagnostic_prompts import first_turn_ids, parser, setup

PLAIN = "plain"


def settings_of(config: str, tuned: TreeSettings) -> TreeSettings:
    """`tuned`, `tuned+L` or `N/D+L` as settings."""
    if config == "tuned":
        return tuned
    tree, _, chain = config.partition("+")
    if tree == "tuned":
        return tuned.tuned(tuned.total_token, tuned.depth, int(chain or 0))
    n, d = tree.split("/")
    return tuned.tuned(int(n), int(d), int(chain or 0))


def decode(model: EaModel, settings: TreeSettings | None, ids: torch.Tensor, max_new_tokens: int) -> dict:
    """tok/s, τ, ms a step after the prefill and the new tokens of one prompt; settings None: plain steps."""
    if settings is not None:
        model.settings = settings
    start = time.perf_counter()
    out = (model.naivegenerate if settings is None else model.eagenerate)(ids, max_new_tokens=max_new_tokens)
    seconds, s = time.perf_counter() - start, model.last_stats
    return {"tok_s": s.new_tokens / seconds, "tokens": s.new_tokens, "seconds": seconds,
            "tau": s.tau if settings is not None else 1.0,
            "step_ms": 1e3 * (s.seconds - s.prefill_seconds) / max(1, s.steps), "new": out[0, ids.shape[1]:].tolist()}


def report(name: str, rows: dict[str, list[dict]], threads: int) -> None:
    plain = rows[PLAIN]
    print(f"\n{name}: {len(plain)} prompts, {threads} threads\n"
          "| settings | median tok/s | median × plain | all prompts: tok/s | × plain | τ | median ms a step "
          "| outputs = plain |\n|---|---|---|---|---|---|---|---|")
    overall = {config: sum(g["tokens"] for g in got) / sum(g["seconds"] for g in got) for config, got in rows.items()}
    for config, got in rows.items():
        ratio = statistics.median(g["tok_s"] / p["tok_s"] for g, p in zip(got, plain))
        same = sum(g["new"] == p["new"] for g, p in zip(got, plain))
        print(f"| {config} | {statistics.median(g['tok_s'] for g in got):.1f} | {ratio:.2f} | "
              f"{overall[config]:.1f} | {overall[config] / overall[PLAIN]:.2f} | "
              f"{statistics.fmean(g['tau'] for g in got):.2f} | {statistics.median(g['step_ms'] for g in got):.1f} | "
              f"{same}/{len(got)} |", flush=True)


def main(argv: list[str] | None = None) -> dict:
    ap = parser(__doc__, "python -m experiments.tree_ab")
    ap.add_argument("--head", default="checkpoints/eagle3-smollm2-135m-instruct")
    ap.add_argument("--configs", default="tuned,tuned+0,2/1+6,4/2+4,8/4+0")
    ap.add_argument("--humaneval", type=int, default=16, help="HumanEval prompts (the first ones)")
    ap.set_defaults(per_category=1, sharegpt=0, threads=2)
    args = ap.parse_args(argv)
    tok, target, sets = setup(args)
    if args.humaneval:
        sets["humaneval"] = load_questions("humaneval")[: args.humaneval]
    model = EaModel.from_modules(target, load_head(args.head, dtype=target.dtype), tok, TreeSettings())
    model.wait_ready()
    model.compile_ahead = False  # every shape compiles in the untimed pass below
    tuned = model.settings
    print(f"tuned: {tuned.describe()}", flush=True)
    configs = {PLAIN: None} | {c: settings_of(c, tuned) for c in args.configs.split(",")}
    results = {}
    with torch.inference_mode():
        for name, questions in sets.items():
            prompts = [first_turn_ids(tok, q) for q in questions]
            for ids in prompts[:4] + [max(prompts[4:], key=lambda p: p.shape[1], default=prompts[0])]:
                for settings in configs.values():
                    decode(model, settings, ids, args.max_new_tokens)
            rows = {c: [] for c in configs}
            for ids in prompts:
                for c, settings in configs.items():
                    rows[c].append(decode(model, settings, ids, args.max_new_tokens))
            report(name, rows, args.threads)
            results[name] = rows
    return results


if __name__ == "__main__":
    main()
