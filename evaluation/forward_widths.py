"""`python -m evaluation.forward_widths`: what a compiled target forward costs at each width.

    python -m evaluation.forward_widths --threads 2 --widths 1,4,8,16

Compiles the target's forward (eagle/compiled/target_graphs.py) at each width over one cache
bucket, then times the widths in interleaved rounds (so a change in the machine's load falls
on all of them) and prints the median ms per forward beside the compile seconds. Width 1 is
plain decoding's step (logits only); wider ones are tree verifies (hidden states too). A second
run with the same inductor cache (`TORCHINDUCTOR_CACHE_DIR`) shows what the cache saves.

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


def forward_ms(runner: CompiledTarget, widths: list[int], rounds: int, reps: int) -> dict[int, dict]:
    """{width: {"compile_s", "ms"}}: each width's first call, then the median of rounds x reps calls."""
    vocab = runner.target.get_input_embeddings().weight.shape[0]
    prompt = torch.randint(0, vocab, (1, CONTEXT), generator=torch.Generator().manual_seed(0))
    runner.prefill(prompt, max(widths))  # one bucket for every width
    calls = {w: _call(runner, w) for w in widths}
    out = {}
    for w, call in calls.items():
        start = time.perf_counter()
        call()
        out[w] = {"compile_s": round(time.perf_counter() - start, 1)}
    times: dict[int, list[float]] = {w: [] for w in widths}
    for _ in range(rounds):
        for w, call in calls.items():
            for _ in range(reps):
                start = time.perf_counter()
                call()
                times[w].append(time.perf_counter() - start)
    for w in widths:
        out[w]["ms"] = round(1000 * statistics.median(times[w]), 2)
    return out


def _call(runner: CompiledTarget, width: int):
    """A forward of `width` rows after the context: plain decoding's step at 1, a chain's verify above."""
    device = runner.target.device
    if width == 1:
        token = torch.tensor([5], device=device)
        return lambda: runner.plain_step(runner, token, CONTEXT)
    tokens, positions = torch.arange(width, device=device), torch.arange(CONTEXT, CONTEXT + width, device=device)
    visible = torch.ones(width, width, dtype=torch.bool).tril()
    return lambda: runner.forward(tokens, positions, visible, CONTEXT, width, hidden=True)


LOWERINGS = {  # --matmuls: inductor options of a graph over `modules`' weights, in place of ours
    "inputs": lambda *modules: {"freezing": False, **graph_cache.weights_key(*modules)},
    "prepack": lambda *modules: {"freezing": True, "cpp.weight_prepack": True},
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
        result = forward_ms(runner, widths, args.rounds, args.reps)
    peak_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print("| rows | compile s | ms per forward |\n|---|---|---|")
    for w, r in result.items():
        print(f"| {w} | {r['compile_s']} | {r['ms']} |")
    print(f"peak resident memory {peak_mb} MB")
    print(json.dumps({"threads": torch.get_num_threads(), "dtype": args.dtype, "matmuls": args.matmuls,
                      "peak_rss_mb": peak_mb, "widths": result}))
    return result


if __name__ == "__main__":
    main()
