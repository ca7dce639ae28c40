"""Where a decode step's time goes: a torch.profiler run over real prompts.

    python -m evaluation.profile --head checkpoints/eagle-smollm2-135m-instruct --prompts mtbench \
        --limit 8 --max-new-tokens 128 --dtype bfloat16 --threads 1

`EaModel` marks its phases with profiler ranges (eagle/common/profiled.py: opened only while a profiler records):

    eagle.step            one decode step
      eagle.draft         growing the draft tree
        eagle.draft.head      head forwards with their draft log-probs (one per depth)
        eagle.draft.tree      node selection and tree buffers
      eagle.verify.mask   the tree attention mask
      eagle.verify.forward    the target forward over the tree
      eagle.verify.accept     greedy / rejection-sampling acceptance
      eagle.cache.commit      gathering the accepted rows of the target KV cache
      eagle.head.update       re-encoding the accepted tokens into the head's cache, the next draft's log-probs
      eagle.plain.forward     a plain step's target forward (a budget of one node: nothing drafted)

"other" rows are a parent's time not covered by its children (top-k, small tensor work,
Python). Unprofiled timings cover all prompts; the profiler records only the first
`--profile-prompts` of them (it keeps every op event in memory: thousands per step). The
table gives each phase's share of a profiled step, scaled to the unprofiled ms per step.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import eagle.decoding.settings as tree_settings
from data_prep.prompt_sets import PROMPT_SETS, load_questions, round_robin
from eagle.targets.tokenizer import chat_prompt

SECTIONS = {  # name -> children
    "eagle.step": ["eagle.draft", "eagle.verify.mask", "eagle.verify.forward", "eagle.verify.accept",
                   "eagle.cache.commit", "eagle.head.update", "eagle.plain.forward"],
    "eagle.draft": ["eagle.draft.head", "eagle.draft.tree"],
}


def breakdown(range_ms: dict[str, float], steps: int) -> list[tuple[str, float]]:
    """(row label, ms per step) in tree order, with an "other" row under each parent."""
    rows: list[tuple[str, float]] = []

    def walk(name: str, indent: int) -> None:
        rows.append(("  " * indent + name.removeprefix("eagle."), range_ms.get(name, 0.0) / steps))
        children = SECTIONS.get(name)
        if children:
            for c in children:
                if c in range_ms:  # phases this decoding ran
                    walk(c, indent + 1)
            covered = sum(range_ms.get(c, 0.0) for c in children)
            rows.append(("  " * (indent + 1) + "other", (range_ms.get(name, 0.0) - covered) / steps))

    walk("eagle.step", 0)
    return rows


def profile_generation(model, prompts: list[torch.Tensor], max_new_tokens: int) -> dict:
    """Profile eagenerate over prompts; returns range totals (ms), steps, tokens and top ops."""
    from torch.profiler import ProfilerActivity, profile

    steps = tokens = 0
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for ids in prompts:
            model.eagenerate(ids, max_new_tokens=max_new_tokens, max_length=1 << 30)
            steps += model.last_stats.steps
            tokens += model.last_stats.new_tokens - 1  # the prefill's token is not a step's
    events = prof.key_averages()
    ranges = {e.key: e.cpu_time_total / 1e3 for e in events if e.key.startswith("eagle.")}
    ops = sorted((e for e in events if not e.key.startswith("eagle.")), key=lambda e: -e.self_cpu_time_total)
    top = [(e.key, e.self_cpu_time_total / 1e3 / max(steps, 1), e.count / max(steps, 1)) for e in ops[:12]]
    return {"ranges_ms": ranges, "steps": steps, "tokens": tokens, "top_ops": top}


def compile_seconds(model) -> float:
    """Seconds the model's compiled forwards have spent compiling so far (0 when eager)."""
    return sum(r.compile_seconds for r in model.runners)


def timed(fn, prompts: list[torch.Tensor], max_new_tokens: int) -> tuple[float, int, int]:
    """(seconds after prefill, decode steps, tokens after the first) of fn over prompts, no profiler."""
    seconds, steps, tokens = 0.0, 0, 0
    model = fn.__self__
    for ids in prompts:
        fn(ids, max_new_tokens=max_new_tokens, max_length=1 << 30)
        st = model.last_stats
        seconds += st.seconds - st.prefill_seconds
        steps += st.steps
        tokens += st.new_tokens - 1
    return seconds, steps, tokens


def report(model, prompts: list[torch.Tensor], max_new_tokens: int, profile_prompts: int = 2) -> dict:
    """Unprofiled timings of eagle and plain decoding, plus the profiled per-step breakdown. A first pass
    over the same prompts runs first, untimed: every graph they reach exists before anything is timed."""
    timed(model.eagenerate, prompts, max_new_tokens)
    timed(model.naivegenerate, prompts, max_new_tokens)
    e_sec, e_steps, e_tok = timed(model.eagenerate, prompts, max_new_tokens)
    n_sec, n_steps, _ = timed(model.naivegenerate, prompts, max_new_tokens)
    prof = profile_generation(model, prompts[:profile_prompts], max_new_tokens)
    profiled_ms = prof["ranges_ms"].get("eagle.step", 0.0) / prof["steps"]
    scale = (e_sec * 1e3 / e_steps) / profiled_ms
    return {
        "steps": e_steps,
        "tau": e_tok / e_steps,
        "ms_per_step": e_sec * 1e3 / e_steps,
        "ms_per_token_plain": n_sec * 1e3 / n_steps,
        "speedup": (n_sec / n_steps) / (e_sec / e_tok),
        "profiler_overhead": 1 / scale,
        "compile_seconds": compile_seconds(model),
        "breakdown_ms": [(name, ms * scale) for name, ms in breakdown(prof["ranges_ms"], prof["steps"])],
        "top_ops": prof["top_ops"],
    }


def markdown(r: dict) -> str:
    lines = [
        f"τ {r['tau']:.2f} tokens/step · {r['ms_per_step']:.1f} ms/step unprofiled · plain decoding "
        f"{r['ms_per_token_plain']:.1f} ms/token · speedup {r['speedup']:.2f}× "
        f"(profiled steps {r['profiler_overhead']:.2f}× slower; compiling {r['compile_seconds']:.0f} s, not counted)",
        "",
        "| phase | ms/step | share |",
        "|---|---:|---:|",
    ]
    total = r["breakdown_ms"][0][1] or 1.0
    for name, ms in r["breakdown_ms"]:
        lines.append(f"| `{name}` | {ms:.2f} | {100 * ms / total:.0f}% |")
    lines += ["", "| top op (self CPU) | ms/step | calls/step |", "|---|---:|---:|"]
    lines += [f"| `{k}` | {ms:.2f} | {c:.1f} |" for k, ms, c in r["top_ops"]]
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m evaluation.profile",
                                description="Per-step time breakdown of EAGLE decoding (torch.profiler).")
    p.add_argument("--base", default="smollm2-135m-instruct")
    p.add_argument("--head", default="checkpoints/eagle-smollm2-135m-instruct")
    p.add_argument("--prompts", default="mtbench", help=PROMPT_SETS)
    p.add_argument("--limit", type=int, default=8, help="first-turn prompts, categories interleaved")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--profile-prompts", type=int, default=2, help="prompts run under the profiler")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=None, help="write profile.json and profile.md here")
    p.add_argument("--no-compile", action="store_true", help="eager target forwards (EaModel(compile=False))")
    tree_settings.add_arguments(p)
    return p.parse_args(argv)


def main(argv=None) -> dict:
    from eagle.model import EaModel

    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = EaModel.from_pretrained(args.base, args.head, torch_dtype=getattr(torch, args.dtype),
                                    settings=tree_settings.from_arguments(args), compile=not args.no_compile)
    model.wait_ready()  # tuned and compiled before anything is timed
    questions = round_robin(load_questions(args.prompts))[: args.limit]
    prompts = [chat_prompt(model.tokenizer, [{"role": "user", "content": q.turns[0]}]) for q in questions]
    start = time.perf_counter()
    r = report(model, prompts, args.max_new_tokens, args.profile_prompts)
    r["args"], r["wall_seconds"] = vars(args), time.perf_counter() - start
    md = markdown(r)
    print(md)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "profile.json").write_text(json.dumps(r, indent=1, default=str))
        (out / "profile.md").write_text(md + "\n")
    return r


if __name__ == "__main__":
    main()
