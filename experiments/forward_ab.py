"""`python -m experiments.forward_ab`: a compiled target's forwards with one of our changes and without it, in one
process.

    python -m experiments.forward_ab {joined,direct,epilogue,gemv,length,symbols,serial} [--base smollm2-135m-instruct]
                                     [--dtype auto] [--threads 2] [--rows 1,4,8] [--rounds 20]

- `joined`: each layer's sibling weights joined (q/k/v, gate/up read by one GEMV call each:
  eagle/compiled/sibling_weights.py) against them apart: two copies of the target, one joined (as every
  `CompiledTarget` is where the GEMV runs) and one not.
- `direct`: a compiled shape's graph called directly (eagle/compiled/direct_call.py) against through dynamo's
  lookup (`set_stance(skip_guard_eval_unsafe=True)`): one runner, its direct calls dropped for the second.
- `epilogue`: graphs compiled without the GEMM template's epilogue fusion (eagle/compiled/graph_cache.py
  `compile_options`) against with it: two copies of the target, the second compiled with fusion on. Only graphs
  whose matmuls take the template differ (every matmul on a CPU without our GEMV: AVX2, fp32).
- `gemv`: graphs whose linear layers take our GEMV (eagle/compiled/gemv.py, `EAGLE_GEMV=auto`) against graphs
  compiled with `EAGLE_GEMV=0`: two copies of the target, the second never joined. Its sums run in another order,
  so the outputs agree to rounding, not bit for bit.
- `length`: graphs whose cache length is dynamic (every bucket runs them: eagle/compiled/target_graphs.py
  `_mark_dynamic`) against graphs compiled for the 256-row bucket alone (only a verify's rows marked dynamic, HF's
  static-address marks kept): two copies of the target. The outputs agree to rounding.
- `serial`: graphs whose pointwise loops run on one thread (inductor's `cpp.min_chunk_size` raised past any loop
  of a decode step; a plain step's one-row loops are serial already) against ours, which fork the OpenMP team for
  loops of 2 rows and more: two copies of the target, the first compiled with the raised chunk.
- `symbols`: graphs traced knowing that every layer's keys and values span the mask's columns (one symbol for the
  cache length, eagle/compiled/grouped_attention.py `same_length`) against graphs traced without (a symbol for
  each of the 2 × layers cache tensors, each passed into the graph as an int at every call): two copies of the
  target.

Each side runs its compiled plain step and verify graph over a 256-row cache holding a 120-token prompt. Each
round times 40 calls (after 5 untimed) of every forward of both sides in turn, so the machine's drift lands on
both; prints each forward's median ms of a call over the rounds, and the median over rounds of with / without.
The two sides' outputs are checked equal bit for bit first (`gemv`, `length`: to fp32 rounding). The first run
on a machine compiles the graphs (~5 min for two copies of the target); later runs take them from inductor's cache.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from unittest.mock import patch

import torch

from eagle.common.precision import fast_dtype
from eagle.compiled import gemv, graph_cache, grouped_attention, target_graphs
from eagle.compiled.target_graphs import CompiledTarget
from eagle.targets.resolve import load_target, resolve_target

PROMPT = 120  # rows the cache holds before the timed forwards
OURS = graph_cache.compile_options  # the options our graphs compile with
DYNAMIC_LENGTH = target_graphs._mark_dynamic  # what our graphs mark dynamic before they compile
SAME_LENGTH = grouped_attention.same_length  # what our graphs' tracing learns of the cache lengths
SERIAL_CHUNK = 1 << 30  # `serial`: elements each thread must get before inductor runs a loop in parallel


def _rows_only(kwargs: dict, cache, hidden: bool) -> None:
    """`length`'s other side: a verify's rows dynamic, the cache length static (one graph per bucket)."""
    if hidden:
        target_graphs.mark_rows(kwargs)


def sides(change: str, base: str, dtype: str | torch.dtype = "bfloat16"
          ) -> dict[str, tuple[CompiledTarget, Callable[[], None]]]:
    """{"with": (runner, setup), "without": ...}: the runner each side calls, its cache holding the same prompt,
    and what to do before a side's calls (`direct`: give the runner its direct calls, or take them away;
    `epilogue`, `serial`: the compile options its graphs compile with, at their first calls; `gemv`: the EAGLE_GEMV policy
    they compile under; `length`: which dimensions its graphs mark dynamic)."""
    def runner(join: bool) -> CompiledTarget:
        out = CompiledTarget(load_target(resolve_target(base), dtype), join_siblings=join)
        out.prefill(_tokens(out, PROMPT, seed=0)[None], 32)
        return out

    if change == "joined":
        return {"with": (runner(True), lambda: None), "without": (runner(False), lambda: None)}
    if change == "gemv":
        def policy(value: str) -> Callable[[], None]:
            return lambda: os.environ.__setitem__("EAGLE_GEMV", value)

        return {"with": (runner(True), policy("auto")), "without": (runner(False), policy("0"))}
    if change == "epilogue":
        def fused(*modules, draft: bool = False) -> dict:
            return {**OURS(*modules, draft=draft), "epilogue_fusion": True}

        return {"with": (runner(True), lambda: setattr(graph_cache, "compile_options", OURS)),
                "without": (runner(True), lambda: setattr(graph_cache, "compile_options", fused))}
    if change == "serial":
        def serial(*modules, draft: bool = False) -> dict:
            return {**OURS(*modules, draft=draft), "cpp.min_chunk_size": SERIAL_CHUNK}

        return {"with": (runner(True), lambda: setattr(graph_cache, "compile_options", serial)),
                "without": (runner(True), lambda: setattr(graph_cache, "compile_options", OURS))}
    if change == "symbols":
        return {"with": (runner(True), lambda: setattr(grouped_attention, "same_length", SAME_LENGTH)),
                "without": (runner(True), lambda: setattr(grouped_attention, "same_length", lambda *_: None))}
    if change == "length":
        return {"with": (runner(True), lambda: setattr(target_graphs, "_mark_dynamic", DYNAMIC_LENGTH)),
                "without": (runner(True), lambda: setattr(target_graphs, "_mark_dynamic", _rows_only))}
    shared, captured = runner(True), {}

    def direct() -> None:
        shared._direct = dict(captured)

    def through_dynamo() -> None:
        captured.update(shared._direct)
        shared._direct = {}

    return {"with": (shared, direct), "without": (shared, through_dynamo)}


def forwards(runner: CompiledTarget, rows: list[int]) -> dict[str, Callable]:
    """The plain step and a verify of each row count (a causal chain of seeded tokens) after the prompt."""
    calls = {"plain": lambda: runner.plain_step(runner, torch.tensor([5]), PROMPT).float()}
    for k in rows:
        tokens = _tokens(runner, k, seed=k)  # [k]
        positions = torch.arange(PROMPT, PROMPT + k)  # [k]
        visible = torch.tril(torch.ones(k, k, dtype=torch.bool))  # [k, k]
        calls[f"verify {k}"] = (lambda t=tokens, p=positions, v=visible:
                                runner.forward(t, p, v, PROMPT, hidden=True).logits.float())
    return calls


def _tokens(runner: CompiledTarget, n: int, seed: int) -> torch.Tensor:
    """n seeded token ids [n] of the target's vocabulary."""
    return torch.randint(runner.target.config.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


def timed(calls: dict[tuple[str, str], Callable], setups: dict[str, Callable], rounds: int) -> dict:
    """ms a call of each (side, forward), one figure a round (5 untimed calls, then 40 timed)."""
    spent = {key: [] for key in calls}
    for _ in range(rounds):
        for (side, what), call in calls.items():
            setups[side]()
            for _ in range(5):
                call()
            start = time.perf_counter()
            for _ in range(40):
                call()
            spent[(side, what)].append((time.perf_counter() - start) / 40 * 1e3)
    return spent


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m experiments.forward_ab", description=__doc__.splitlines()[0])
    ap.add_argument("change", choices=("joined", "direct", "epilogue", "gemv", "length", "symbols", "serial"))
    ap.add_argument("--base", default="smollm2-135m-instruct")
    ap.add_argument("--dtype", default="auto", help="auto: bf16 where the CPU has bf16 arithmetic, else fp32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,4,8", help="verify widths")
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args(argv)
    if args.change in ("joined", "gemv") and not gemv.active():
        raise SystemExit("the GEMV kernel does not run on this CPU (EAGLE_GEMV, eagle/compiled/gemv.py): "
                         f"nothing to compare ({args.change})")
    torch.set_num_threads(args.threads)
    with torch.inference_mode(), patch.dict(os.environ):  # `gemv` sets EAGLE_GEMV while a side compiles
        try:
            spent, names, agree = _measured(args)
        finally:
            graph_cache.compile_options = OURS  # `epilogue` and `serial` swap it while a side compiles
            target_graphs._mark_dynamic = DYNAMIC_LENGTH  # and `length` this
            grouped_attention.same_length = SAME_LENGTH  # and `symbols` this
    print(f"{args.change}: {args.threads} threads, {args.rounds} rounds; {agree}\n"
          "| forward | with: ms | without: ms | with / without (median of rounds) |\n|---|---|---|---|")
    result = {}
    for what in names:
        on, off = spent[("with", what)], spent[("without", what)]
        ratio = statistics.median(a / b for a, b in zip(on, off))
        result[what] = {"with_ms": statistics.median(on), "without_ms": statistics.median(off), "ratio": ratio}
        print(f"| {what} | {result[what]['with_ms']:.2f} | {result[what]['without_ms']:.2f} | {ratio:.3f} |")
    return result


def _measured(args) -> tuple[dict, list[str], str]:
    """Both sides' forwards checked equal bit for bit (`gemv`: close), then timed: ({(side, forward): ms a
    round}, forwards, how the outputs agree)."""
    pair = sides(args.change, args.base, fast_dtype(args.dtype))
    setups = {side: setup for side, (_, setup) in pair.items()}
    calls = {(side, what): call for side, (runner, _) in pair.items()
             for what, call in forwards(runner, [int(r) for r in args.rows.split(",")]).items()}
    names = list(dict.fromkeys(what for _, what in calls))
    gap = 0.0
    for what in names:
        outputs = []
        for side in pair:
            setups[side]()
            outputs.append(calls[(side, what)]())
        gap = max(gap, (outputs[0] - outputs[1]).abs().max().item())
        if gap > (1e-2 if args.change in ("gemv", "length") else 0):
            raise SystemExit(f"{what}: the outputs with and without {args.change} differ by {gap:g}")
    agree = "outputs equal bit for bit" if gap == 0 else f"outputs differ by at most {gap:.2g}"
    return timed(calls, setups, args.rounds), names, agree


if __name__ == "__main__":
    main()
