"""Online and offline training runs side by side: loss curves, tokens/s, wall-clock and τ.

    python -m experiments.online_offline --runs offline=DIR online=DIR --report results/online-vs-offline \
        [--seconds SECONDS_FILE]

Reads each run's `metrics.jsonl` (train/tracking.py) and, when the report folder has them,
`tau-NAME.json` (`python -m evaluation.tau HEAD --prompts mtbench ...` output). Writes
`loss.png` (feature and token loss per step, one line per run), `summary.json` and
`summary.md`. scripts/online_vs_offline.sh runs the whole comparison on the embedded default.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from train.tracking import read_metrics

CURVES = ("train/feature_loss", "train/token_loss")


def summarize(name: str, run: Path, report: Path, seconds: dict[str, float]) -> dict:
    """One row: the last logged losses, the median tokens/s over log windows (the first, warm-up one
    left out), the held-out metrics at the end, τ when measured, and the stage seconds."""
    metrics = read_metrics(run)
    steps = sorted(s for s in metrics if "train/tokens_per_s" in metrics[s])
    rates = [metrics[s]["train/tokens_per_s"] for s in steps[1:]] or [metrics[s]["train/tokens_per_s"] for s in steps]
    last = metrics[steps[-1]] if steps else {}
    evals = [s for s in sorted(metrics) if "eval/feature_loss" in metrics[s]]
    row = {"run": name, "steps": steps[-1] if steps else 0, "tokens_per_s": statistics.median(rates) if rates else None,
           "final_train": {k: last.get(k) for k in CURVES},
           "final_eval": {k: v for k, v in metrics[evals[-1]].items() if k.startswith("eval/")} if evals else {}}
    tau = report / f"tau-{name}.json"
    if tau.exists():
        row["tau"] = {k: v for k, v in json.loads(tau.read_text()).items() if k.startswith("tau_")}
    mine = {f"train_{name}", *(("data_prep",) if name == "offline" else ())}
    row["seconds"] = {k: v for k, v in seconds.items() if k in mine}
    return row


def plot(runs: dict[str, Path], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CURVES), figsize=(11, 4))
    for (name, run), style in zip(runs.items(), ("-", "--", ":", "-."), strict=False):
        metrics = read_metrics(run)
        for ax, key in zip(axes, CURVES, strict=True):
            steps = [s for s in sorted(metrics) if key in metrics[s]]
            ax.plot(steps, [metrics[s][key] for s in steps], style, label=name)
    for ax, key in zip(axes, CURVES, strict=True):
        ax.set_xlabel("optimizer step")
        ax.set_title(key)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def markdown(rows: list[dict]) -> str:
    lines = ["| run | steps | train tok/s (median) | wall-clock s | feature loss (eval) | token loss (eval) "
             "| top-1 (eval) | τ tree (MT-bench) | τ chain |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        e, tau = r["final_eval"], r.get("tau", {})
        wall = " + ".join(f"{v:.0f} ({k})" for k, v in r["seconds"].items()) or "-"
        lines.append(f"| {r['run']} | {r['steps']} | {r['tokens_per_s']:.0f} | {wall} | "
                     f"{e.get('eval/feature_loss', float('nan')):.4f} | {e.get('eval/token_loss', float('nan')):.4f} | "
                     f"{e.get('eval/top1', float('nan')):.4f} | {tau.get('tau_tree', float('nan')):.3f} | "
                     f"{tau.get('tau_chain', float('nan')):.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="python -m experiments.online_offline", description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="+", required=True, metavar="NAME=DIR", help="training output_dirs")
    ap.add_argument("--report", required=True, help="folder for loss.png, summary.json, summary.md (and tau-NAME.json)")
    ap.add_argument("--seconds", help="lines 'stage seconds' (scripts/online_vs_offline.sh writes them)")
    args = ap.parse_args(argv)
    runs = dict(item.split("=", 1) for item in args.runs)
    runs = {k: Path(v) for k, v in runs.items()}
    report = Path(args.report)
    report.mkdir(parents=True, exist_ok=True)
    seconds = {}
    if args.seconds and Path(args.seconds).exists():
        lines = Path(args.seconds).read_text().splitlines()
        seconds = {k: float(v) for k, v in (line.split() for line in lines if line)}
    rows = [summarize(name, run, report, seconds) for name, run in runs.items()]
    plot(runs, report / "loss.png")
    (report / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    (report / "summary.md").write_text(markdown(rows))
    print(markdown(rows))
    return rows


if __name__ == "__main__":
    main()
