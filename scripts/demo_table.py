"""The demo's closing table: τ and speedup of each head from the bench report, and where
every artifact of the run was written. Usage: scripts/demo_table.py --run DIR --report DIR"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def rows(results: dict) -> list[tuple[str, str, dict]]:
    """(method, head folder, summary over all prompts) for each benchmarked method."""
    args = results["meta"]["args"]
    heads = {"eagle2": args["head"], "eagle3": args["head3"]}
    heads.update(dict(item.split("=", 1) for item in args.get("heads", "").split(",") if item.strip()))
    out = []
    for method, table in results["summary"].items():
        kind, _, label = method.partition("@")
        head = "-" if kind == "vanilla" else heads[label or ("eagle3" if kind.startswith("eagle3") else "eagle2")]
        out.append((method, head, table["all"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True, help="the training run's output_dir")
    ap.add_argument("--report", required=True, help="the bench's --out")
    ap.add_argument("--store", default="?", help="the feature store")
    ap.add_argument("--seconds", type=int, default=0, help="wall time of the demo")
    args = ap.parse_args()
    results = json.loads((Path(args.report) / "results.json").read_text())
    print(f"\n== demo finished in {args.seconds // 60} min {args.seconds % 60} s\n")
    print(f"{'method':<14} {'head':<44} {'tau':>5} {'speedup':>8} {'tok/s':>7}  greedy = vanilla")
    for method, head, row in rows(results):
        print(f"{method:<14} {head:<44} {row['tau']:>5.2f} {row['speedup']:>7.2f}x {row['tokens_per_s']:>7.1f}  "
              f"{row.get('equal_to_vanilla') or '-'}")
    run = Path(args.run)
    wandb_runs = sorted(run.glob("wandb/offline-run-*"))
    checkpoints = sorted(run.glob("checkpoints/step*"))
    print(f"\nfeature store:    {args.store}")
    print(f"trained head:     {run / 'head'}  (DeepSpeed checkpoint: {checkpoints[-1] if checkpoints else '-'})")
    print(f"W&B offline run:  {wandb_runs[-1] if wandb_runs else '-'}  (upload: wandb sync DIR)")
    print(f"bench report:     {Path(args.report) / 'results.md'}  (+ results.json, plots)")
    bench = results["meta"]["args"]
    print("tau = new tokens per target forward; speedup = tokens/s over vanilla HF generate, same run, interleaved;")
    print(f"every head decodes {'eagerly' if bench.get('no_compile') else 'compiled'} with the same tree "
          f"({bench['total_token']} nodes, depth {bench['depth']}): for the compiled decoder with each head's tree")
    print("tuned, see python -m evaluation.bench (README, Results).")


if __name__ == "__main__":
    main()
