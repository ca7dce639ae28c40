"""`python -m evaluation.forward_widths`: what a compiled target forward costs at each width.

    python -m evaluation.forward_widths --threads 2 --widths 1,4,8,16
    python -m evaluation.forward_widths --threads 2 --widths 1,2,4,8,16 --static   # against a graph per width

Runs the target's compiled forward (eagle/compiled/target_graphs.py) at each width over one cache
bucket, then times the widths in interleaved rounds (so a change in the machine's load falls
on all of them) and prints the median ms per forward beside the seconds of its first call. Width
1 is plain decoding's step (logits only, its own static graph); wider ones are tree verifies
(hidden states too), all through the one dynamic-rows graph, which the first of them compiles.
`--static` also times a static graph per width (logits only) in the same rounds, and their ratio.
A second run with the same inductor cache (`TORCHINDUCTOR_CACHE_DIR`) shows what the cache saves.

`--matmuls` compares other lowerings of the linear layers with ours (`template`: frozen weights,
inductor's C++ GEMM template, nothing timed, eagle/compiled/graph_cache.py): `autotune` (the
template timed against ATen's matmuls, the faster kept), `aten` (frozen, ATen's matmuls),
`inputs` (weights passed to the graph, not frozen), `prepack` (frozen, oneDNN's packed weights)
and `eager` (not compiled). The peak resident memory is printed too: the template's packed weights
are one copy for all graphs (eagle/compiled/shared_constants.py), oneDNN's one per graph.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

import torch

import eagle.compiled.graph_cache as graph_cache
from eagle.compiled.target_graphs import CompiledTarget
from eagle.targets.resolve import load_causal_lm, resolve_target

CONTEXT = 40  # committed rows before the timed forwards


def forward_ms(runner: CompiledTarget, widths: list[int], rounds: int, reps: int,
               static: bool = False) -> dict[int, dict]:
    """{width: {"compile_s", "ms"}}: each width's first call, then the median of rounds x reps calls;
    `static`: also "static_compile_s", "static_ms" of a static graph per width above 1."""
    prefill_context(runner, max(widths))  # one bucket for every width
    calls = {("", w): _call(runner, w, hidden=True) for w in widths}
    if static:
        calls.update({("static_", w): _call(runner, w, hidden=False) for w in widths if w > 1})
    out: dict[int, dict] = {w: {} for w in widths}
    for (kind, w), call in calls.items():
        start = time.perf_counter()
        call()
        out[w][f"{kind}compile_s"] = round(time.perf_counter() - start, 1)
    times: dict[tuple, list[float]] = {key: [] for key in calls}
    for _ in range(rounds):
        for key, call in calls.items():
            for _ in range(reps):
                start = time.perf_counter()
                call()
                times[key].append(time.perf_counter() - start)
    for (kind, w), spent in times.items():
        out[w][f"{kind}ms"] = round(1000 * statistics.median(spent), 2)
    return out


def prefill_context(runner: CompiledTarget, rows: int) -> None:
    """Commit CONTEXT seeded random tokens, in a cache bucket with room for `rows` more."""
    vocab = runner.target.get_input_embeddings().weight.shape[0]
    runner.prefill(torch.randint(0, vocab, (1, CONTEXT), generator=torch.Generator().manual_seed(0)), rows)


def _call(runner: CompiledTarget, width: int, hidden: bool):
    """A forward of `width` rows after the context: plain decoding's step at 1; above, a chain's verify
    (`hidden`: the dynamic-rows graph) or the same rows through a static graph of that width, logits only."""
    device = runner.target.device
    if width == 1:
        token = torch.tensor([5], device=device)
        return lambda: runner.plain_step(runner, token, CONTEXT)
    tokens, positions = torch.arange(width, device=device), torch.arange(CONTEXT, CONTEXT + width, device=device)
    visible = torch.ones(width, width, dtype=torch.bool).tril()
    return lambda: runner.forward(tokens, positions, visible, CONTEXT, hidden=hidden)


LOWERINGS = {  # --matmuls: inductor options of a target graph over `modules`' weights, in place of ours
    "inputs": lambda *modules, draft=False: {"freezing": False, **graph_cache.weights_key(*modules)},
    "prepack": lambda *modules, draft=False: {"freezing": True, "cpp.weight_prepack": True},
}


def use_matmuls(kind: str, runner: CompiledTarget) -> None:
    """Lower the runner's graphs with `kind` (LOWERINGS, `eager` or one of our policies, graph_cache.MATMULS)."""
    if kind in graph_cache.MATMULS:
        os.environ["EAGLE_MATMULS"] = kind
    elif kind == "eager":
        runner._compiled = runner.target.forward
    elif kind in LOWERINGS:
        graph_cache.compile_options = LOWERINGS[kind]


def main(argv: list[str] | None = None) -> dict[int, dict]:
    p = argparse.ArgumentParser(prog="python -m evaluation.forward_widths", description=__doc__.splitlines()[0])
    p.add_argument("--base", default="smollm2-135m-instruct", help="target: alias, folder or Hub id")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--widths", default="1,4,8,16", help="comma-separated forward widths (rows)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--reps", type=int, default=15, help="calls of each width per round")
    p.add_argument("--static", action="store_true", help="also time a static graph per width, in the same rounds")
    p.add_argument("--matmuls", default="template", choices=[*graph_cache.MATMULS, *LOWERINGS, "eager"],
                   help="how the linear layers are lowered (template: ours)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_causal_lm(resolve_target(args.base), getattr(torch, args.dtype), "cpu")
    widths = [int(w) for w in args.widths.split(",")]
    runner = CompiledTarget.of(target)
    use_matmuls(args.matmuls, runner)
    with torch.inference_mode():
        result = forward_ms(runner, widths, args.rounds, args.reps, args.static)
    peak_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(table(result))
    print(f"peak resident memory {peak_mb} MB")
    print(json.dumps({"threads": torch.get_num_threads(), "dtype": args.dtype, "matmuls": args.matmuls,
                      "peak_rss_mb": peak_mb, "widths": result}))
    return result


def table(result: dict[int, dict]) -> str:
    """Markdown: per width the first call's seconds and the median ms (static graphs' beside, if timed)."""
    static = any("static_ms" in r for r in result.values())
    lines = ["| rows | first call s | ms per forward |" + (" static graph: first call s | ms | dynamic ÷ static |"
                                                        if static else ""),
             "|---|---|---|" + ("---|---|---|" if static else "")]
    for w, r in result.items():
        line = f"| {w} | {r['compile_s']} | {r['ms']} |"
        if static:
            line += (f" {r['static_compile_s']} | {r['static_ms']} | {r['ms'] / r['static_ms']:.2f} |"
                     if "static_ms" in r else " | | |")
        lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
