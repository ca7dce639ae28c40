"""`python -m experiments.joined_siblings`: compiled target forwards with each layer's sibling weights joined
(q/k/v, gate/up read by one GEMV call each: eagle/compiled/sibling_weights.py) against the same forwards with
them apart, in one process.

    python -m experiments.joined_siblings [--base smollm2-135m-instruct] [--threads 2] [--rows 1,4,8] [--rounds 20]

Two copies of the target, one joined (as every `CompiledTarget` is where the GEMV runs) and one not, each with
its compiled plain step and verify graph over a 256-row cache holding a 120-token prompt. Each round times 40
calls (after 5 untimed) of every forward of both copies in turn, so the machine's drift lands on both; prints
each forward's median ms of a call over the rounds, and the median over rounds of joined / apart. The two
copies' outputs are checked equal bit for bit first. The first run on a machine compiles four graphs
(~5 min); later runs take them from inductor's cache.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from eagle.compiled import gemv
from eagle.compiled.target_graphs import CompiledTarget
from eagle.targets.resolve import load_target, resolve_target

PROMPT = 120  # rows the cache holds before the timed forwards


def runners(base: str) -> dict[str, CompiledTarget]:
    """{"joined": ..., "apart": ...}: a runner over each copy of the target, its cache holding the same prompt."""
    out = {}
    for name in ("joined", "apart"):
        runner = CompiledTarget(load_target(resolve_target(base), "bfloat16"), join_siblings=name == "joined")
        runner.prefill(_tokens(runner, PROMPT, seed=0)[None], 32)
        out[name] = runner
    return out


def forwards(runner: CompiledTarget, rows: list[int]) -> dict[str, callable]:
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


def timed(calls: dict[tuple[str, str], callable], rounds: int) -> dict[tuple[str, str], list[float]]:
    """ms a call of each forward, one figure a round (5 untimed calls, then 40 timed)."""
    spent = {key: [] for key in calls}
    for _ in range(rounds):
        for key, call in calls.items():
            for _ in range(5):
                call()
            start = time.perf_counter()
            for _ in range(40):
                call()
            spent[key].append((time.perf_counter() - start) / 40 * 1e3)
    return spent


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m experiments.joined_siblings", description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,4,8", help="verify widths")
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args(argv)
    if not gemv.active():
        raise SystemExit("the GEMV kernel does not run on this CPU (EAGLE_GEMV, eagle/compiled/gemv.py): "
                         "nothing is joined")
    torch.set_num_threads(args.threads)
    with torch.inference_mode():
        pair = runners(args.base)
        calls = {(name, what): call for name, runner in pair.items()
                 for what, call in forwards(runner, [int(r) for r in args.rows.split(",")]).items()}
        names = list(dict.fromkeys(what for _, what in calls))
        for what in names:
            if not torch.equal(calls[("joined", what)](), calls[("apart", what)]()):
                raise SystemExit(f"{what}: joined and apart outputs differ")
        spent = timed(calls, args.rounds)
    print(f"{args.threads} threads, {args.rounds} rounds; outputs equal bit for bit\n"
          "| forward | joined: ms | apart: ms | joined / apart (median of rounds) |\n|---|---|---|---|")
    result = {}
    for what in names:
        joined, apart = spent[("joined", what)], spent[("apart", what)]
        ratio = statistics.median(j / a for j, a in zip(joined, apart))
        result[what] = {"joined_ms": statistics.median(joined), "apart_ms": statistics.median(apart), "ratio": ratio}
        print(f"| {what} | {result[what]['joined_ms']:.2f} | {result[what]['apart_ms']:.2f} | {ratio:.3f} |")
    return result


if __name__ == "__main__":
    main()
