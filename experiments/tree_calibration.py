"""Are the head's draft probabilities calibrated, and would calibrated scores pick better trees?

    python -m experiments.tree_calibration [--head DIR] [--per-category 2] [--sharegpt 0] [--humaneval 0]
                                           [--positions 128] [--depth 6] [--top-k 10] [--out FILE]
    python -m experiments.tree_calibration --load FILE      # the analysis again, from a saved run

EAGLE-2 keeps the n-1 candidates of the best cumulative draft log-prob, which is the tree of the most accepted
tokens expected only if a draft probability is the chance its token is the target's. This decodes the greedy
text of each prompt a token at a time (eager forwards), records the candidate pool at every position (`depth`
levels, `top_k` children of the `top_k` best nodes of each level) with each candidate's own draft log-prob and
whether its root-to-node path is the greedy text, then prints

- **calibration**: by depth and by bins of a node's own draft probability q, the share of nodes whose parent
  path is right that are right themselves (q is calibrated where the two agree);
- **selection**: the walk's τ (eagle/tuning/tuner.py `walk_tau`, no lookup chain) of trees of n nodes up to
  depth d chosen by EAGLE-2's score and by the cumulative log of a per-depth calibration of q (isotonic bins
  fitted on half the prompts, scored on the other half, and the other way round).

Greedy decoding is deterministic, so the figures do not depend on the machine's load.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from data_prep.prompt_sets import load_questions
from eagle.decoding.settings import TreeSettings
from eagle.decoding.tree import build_tree
from eagle.decoding.verify import greedy_ids
from eagle.heads.checkpoint import load_head
from eagle.model import EaModel
from eagle.tuning.tuner import walk_tau
from experiments.diagnostic_prompts import first_turn_ids, parser, setup

TREES = ((4, 2), (4, 3), (8, 3), (8, 4), (16, 4), (16, 6), (32, 6), (60, 6))  # (n, d) scored
BINS = np.array([0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0 + 1e-9])


def record_prompt(model: EaModel, ids: torch.Tensor, positions: int, depth: int, top_k: int) -> list[dict]:
    """The pool at each position of the prompt's greedy text [1, P], and which candidates are right."""
    state, _ = model.prefill(ids)
    pools = []
    for t in range(positions + depth - 1):  # the last `depth - 1` tokens only label the last pools
        if t < positions:
            tokens, scores, parents = model.draft_candidates(state, depth, top_k)
            pools.append({"tokens": tokens.tolist(), "scores": scores.tolist(), "parents": parents.tolist()})
        tree = build_tree(state.root.reshape(1), torch.tensor([-1]))
        verified = model.verify(state, tree)
        state, _ = model.commit(state, tree, verified, torch.zeros(1, dtype=torch.long),
                                int(greedy_ids(verified.logits)[0]))
        if int(state.ids[0, -1]) in model.eos_ids:
            break
    text = state.ids[0].tolist()
    start = ids.shape[1]  # text[start] is the root of the first position
    for t, pool in enumerate(pools):
        pool["depths"] = _depths(pool["parents"])
        pool["correct"] = _correct(pool, text[start + t + 1:])
    return pools


def _correct(pool: dict, following: list[int]) -> list[bool]:
    """[M] each candidate's root-to-node path equals the tokens that followed its root."""
    ok = []
    for tok, up, d in zip(pool["tokens"], pool["parents"], pool["depths"]):
        ok.append((up < 0 or ok[up]) and d <= len(following) and tok == following[d - 1])
    return ok


def _depths(parents: list[int]) -> list[int]:
    """[M] each candidate's depth (1: the root's children), parents listed first."""
    depth = []
    for up in parents:
        depth.append(1 if up < 0 else depth[up] + 1)
    return depth


def _own_logp(pool: dict) -> list[float]:
    s, up = pool["scores"], pool["parents"]
    return [s[i] - (s[u] if u >= 0 else 0.0) for i, u in enumerate(up)]


def calibration_table(pools: list[dict], depth: int) -> list[tuple[int, int, float, float, int]]:
    """(depth, bin, mean q, share right, nodes) over nodes whose parent path is right."""
    rows = []
    cells: dict[tuple[int, int], list[tuple[float, bool]]] = {}
    for pool in pools:
        d_of, q_of, ok = pool["depths"], _own_logp(pool), pool["correct"]
        for i, up in enumerate(pool["parents"]):
            if up >= 0 and not ok[up]:
                continue
            q = math.exp(q_of[i])
            cells.setdefault((d_of[i], int(np.searchsorted(BINS, q, side="right")) - 1), []).append((q, ok[i]))
    for d in range(1, depth + 1):
        for b in range(len(BINS) - 1):
            cell = cells.get((d, b), [])
            if cell:
                rows.append((d, b, float(np.mean([q for q, _ in cell])), float(np.mean([o for _, o in cell])),
                             len(cell)))
    return rows


def fit_calibration(pools: list[dict], depth: int) -> dict[int, np.ndarray]:
    """Per depth, a non-decreasing map from q to the chance of being right given a right parent: the pooled
    adjacent violators over BINS (each bin's share, merged until non-decreasing), one value per bin."""
    fitted = {}
    for d, rows in _by_depth(calibration_table(pools, depth)).items():
        blocks = [[float(share) * n, n, [b]] for _, b, _, share, n in rows]  # [right, count, bins]
        merged: list[list] = []
        for block in blocks:
            merged.append(block)
            while len(merged) > 1 and merged[-2][0] / merged[-2][1] > merged[-1][0] / merged[-1][1]:
                right, count, bins = merged.pop()
                merged[-1] = [merged[-1][0] + right, merged[-1][1] + count, merged[-1][2] + bins]
        value = np.full(len(BINS) - 1, np.nan)
        for right, count, bins in merged:
            value[bins] = right / count
        fitted[d] = _filled(value)
    return fitted


def _by_depth(rows):
    out: dict[int, list] = {}
    for row in rows:
        out.setdefault(row[0], []).append(row)
    return out


def _filled(value: np.ndarray) -> np.ndarray:
    """Empty bins take the nearest fitted bin's value below them (above for the lowest)."""
    known = np.flatnonzero(~np.isnan(value))
    out = value.copy()
    for b in range(len(value)):
        if np.isnan(out[b]):
            below = known[known < b]
            out[b] = value[below[-1]] if below.size else value[known[0]]
    return np.clip(out, 1e-4, 1.0)


def calibrated_scores(pool: dict, fitted: dict[int, np.ndarray]) -> list[float]:
    """Cumulative log of the calibrated chances along each candidate's path."""
    d_of, q_of, up = pool["depths"], _own_logp(pool), pool["parents"]
    out = []
    for i, u in enumerate(up):
        table = fitted.get(d_of[i], fitted[max(fitted)])
        b = min(int(np.searchsorted(BINS, math.exp(q_of[i]), side="right")) - 1, len(BINS) - 2)
        out.append((out[u] if u >= 0 else 0.0) + math.log(table[b]))
    return out


def accepted(pool: dict, scores: list[float], n: int, d: int) -> int:
    """Tokens a step accepts with the n-1 best candidates of depth <= d by `scores` (closed under parents,
    the best first among equals), root and bonus included."""
    d_of, up, ok = pool["depths"], pool["parents"], pool["correct"]
    order = sorted((i for i in range(len(up)) if d_of[i] <= d), key=lambda i: (-scores[i], d_of[i]))
    chosen: set[int] = set()
    for i in order:
        if len(chosen) == n - 1:
            break
        if up[i] < 0 or up[i] in chosen:
            chosen.add(i)
    return 1 + max((d_of[i] for i in chosen if ok[i]), default=0)


def tau(groups: list[tuple[list[list[dict]], dict | None]], n: int, d: int) -> float:
    """The walk's τ (no chain) of trees of n nodes up to depth d over every prompt of `groups`, each group's
    (prompts, calibration: None for EAGLE-2's score) scored by its calibration."""
    lengths, ends = [], []
    for prompts, fitted in groups:
        for pools in prompts:
            for pool in pools:
                scores = pool["scores"] if fitted is None else calibrated_scores(pool, fitted)
                lengths.append(accepted(pool, scores, n, d))
            ends.append(len(lengths))
    return walk_tau(lengths, [0] * len(lengths), ends, 0)


def report(runs: dict[str, list[list[dict]]], depth: int) -> None:
    for name, prompts in runs.items():
        pools = [p for pools in prompts for p in pools]
        print(f"\n## {name}: {len(prompts)} prompts, {len(pools)} positions\n")
        print("| depth | q bin | mean q | right given a right parent | nodes |\n|---:|---|---:|---:|---:|")
        for d, b, q, share, count in calibration_table(pools, depth):
            print(f"| {d} | {BINS[b]:.2f}-{min(BINS[b + 1], 1.0):.2f} | {q:.3f} | {share:.3f} | {count} |")
        halves = (prompts[0::2], prompts[1::2])
        fits = [fit_calibration([p for pools in half for p in pools], depth) for half in halves]
        print("\n| tree n/d | τ EAGLE-2 score | τ calibrated (held-out half) | ratio |\n|---|---:|---:|---:|")
        for n, d in TREES:
            if d > depth:
                continue
            base = tau([(prompts, None)], n, d)
            crossed = tau([(halves[0], fits[1]), (halves[1], fits[0])], n, d)  # each half by the other's map
            print(f"| {n}/{d} | {base:.3f} | {crossed:.3f} | {crossed / base:.3f} |")


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__, "python -m experiments.tree_calibration")
    ap.add_argument("--head", default="checkpoints/eagle3-smollm2-135m-instruct")
    ap.add_argument("--positions", type=int, default=128)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--humaneval", type=int, default=0, help="HumanEval prompts (the first ones)")
    ap.add_argument("--out", type=Path, help="save the pools (JSON) for --load")
    ap.add_argument("--load", type=Path, help="analyse a saved run instead of decoding")
    ap.set_defaults(per_category=2, sharegpt=0)
    args = ap.parse_args(argv)
    if args.load:
        saved = json.loads(args.load.read_text())
        report(saved["runs"], saved["depth"])
        return
    tok, target, sets = setup(args)
    target = target.float()  # fp32: the greedy text and the draft as an fp32 decoder has them
    model = EaModel(target, load_head(args.head, dtype=torch.float32), tok,
                    TreeSettings(total_token=2, depth=args.depth, top_k=args.top_k), compile=False)
    if args.humaneval:
        sets["humaneval"] = load_questions("humaneval")[: args.humaneval]
    runs = {}
    with torch.inference_mode():
        for name, questions in sets.items():
            runs[name] = [record_prompt(model, first_turn_ids(tok, q), args.positions, args.depth, args.top_k)
                          for q in questions]
            print(f"{name}: {sum(len(p) for p in runs[name])} positions", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"depth": args.depth, "top_k": args.top_k, "head": args.head, "runs": runs}))
    report(runs, args.depth)


if __name__ == "__main__":
    main()
