"""The parity comparison's report: one table (results.md), the raw numbers (results.json) and the
loss and draft-accuracy curves of every trainer on one figure (curves.png)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from evaluation.parity_run import TrainerRun


def _fmt(x, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}"


def _accept(values) -> str:
    return " / ".join(_fmt(v) for v in values) if values else "–"


def table(runs: list[TrainerRun], scores: dict[str, dict]) -> str:
    """Markdown: per run, τ (ours: chain of 3 and tree; vLLM's), per-position acceptance, speed."""
    head = ("| run | steps | tokens | wall s | tokens/s | final loss | final top-1 | τ chain-3 (ours) | α by position "
            "(ours) | τ tree (ours) | τ vLLM k=3 | α by position (vLLM) |\n|" + "---|" * 12)
    rows = [head]
    for run in runs:
        s = scores.get(run.trainer, {})
        last = run.curve[-1] if run.curve else None
        rows.append(
            f"| {run.trainer} | {run.recipe.steps} | {run.tokens:,} | {run.seconds:.0f} | {run.tokens_per_s:.0f} | "
            f"{_fmt(last.loss if last else None, 3)} | {_fmt(last.top1 if last else None, 3)} | "
            f"{_fmt(s.get('chain3_tau'))} | {_accept(s.get('chain3_accept'))} | {_fmt(s.get('tree_tau'))} | "
            f"{_fmt(s.get('vllm_tau'))} | {_accept(s.get('vllm_accept')) if 'vllm_accept' in s else s.get('vllm_skipped', '–')} |")
    return "\n".join(rows)


def recipes(runs: list[TrainerRun]) -> str:
    lines = ["| run | lr | schedule | warmup | weight decay | TTT steps | TTT decay | loss | optimizer |",
             "|" + "---|" * 9]
    for run in runs:
        r = run.recipe
        lines.append(f"| {run.trainer} | {r.lr:g} | {r.schedule} (floor {r.min_lr_ratio:g}) | {r.warmup_steps} | "
                     f"{r.weight_decay:g} | {r.ttt_steps} | {r.ttt_decay:g} | {r.loss} | {r.optimizer} |")
    return "\n".join(lines)


def plot(runs: list[TrainerRun], path: Path) -> None:
    """Training loss and first-position top-1 against the optimizer step, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_top1) = plt.subplots(1, 2, figsize=(12, 4.5))
    for run in runs:
        steps = [p.step for p in run.curve]
        ax_loss.plot(steps, [p.loss for p in run.curve], label=run.trainer)
        ax_top1.plot(steps, [p.top1 if p.top1 is not None else math.nan for p in run.curve], label=run.trainer)
    ax_loss.set(xlabel="optimizer step", ylabel="training loss (each trainer's own)", yscale="log")
    ax_top1.set(xlabel="optimizer step", ylabel="top-1, first draft position (training batches)")
    for ax in (ax_loss, ax_top1):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(runs: list[TrainerRun], scores: dict[str, dict], data, out: Path) -> str:
    """results.md, results.json and curves.png in `out`; returns the markdown."""
    text = (f"# Trainer parity\n\n{len(data.train_idx):,} training records of `{data.store}`, {data.steps} optimizer "
            f"steps of {data.batch_tokens} tokens, draft vocabulary {len(data.draft_ids):,}.\n\n"
            f"{table(runs, scores)}\n\n## Recipes\n\n{recipes(runs)}\n\n![curves](curves.png)\n")
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps({"runs": [r.to_json() for r in runs], "scores": scores,
                                                  "store": str(data.store), "steps": data.steps,
                                                  "train_records": len(data.train_idx)}, indent=1))
    if any(r.curve for r in runs):
        plot(runs, out / "curves.png")
    return text
