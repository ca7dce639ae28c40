"""`python -m experiments.draft_int8`: EAGLE decoding with the draft head's weights read as int8 against exact, in one
process.

    python -m experiments.draft_int8 [--head DIR] [--threads 2] [--total-token 4] [--depth 2] [--prompts 8] [--rounds 3]

Where the GEMV runs its AVX2 form in the fp32 kind (eagle/compiled/gemv.py `int8_drafts`), the draft head's
compiled graphs read each weight as int8 codes and a scale a row. Two models share the target (one compiled
runner) and each has its own copy of the head, one compiled with `EAGLE_DRAFT_INT8=0`, the other with the default.
Both decode a fixed tree without a lookup chain (so τ compares the heads alone), after two untimed generations
that compile every shape. Each round decodes every prompt (MT-bench first turns, one in ten) with both, in
alternating order, so the machine's drift lands on both. Prints each side's median ms a token after the prefill and
mean τ, the median of the paired per-prompt ratios, and whether the outputs were equal (they must be: the draft
proposes, the target decides).
"""

from __future__ import annotations

import json
import os
import statistics

import torch

from eagle.compiled import gemv
from eagle.model import EaModel
from eagle.targets.tokenizer import chat_prompt
from experiments.diagnostic_prompts import ab_parser, mtbench_sample

SIDES = ("0", "auto")  # EAGLE_DRAFT_INT8: exact, then int8 where the CPU takes it


def load(choice: str, args) -> EaModel:
    """A model whose head graphs compile under EAGLE_DRAFT_INT8=choice (compiled here, by two generations)."""
    os.environ["EAGLE_DRAFT_INT8"] = choice
    model = EaModel.from_pretrained(args.base, args.head, torch_dtype=torch.float32, background=False, quiet=True,
                                    total_token=args.total_token, depth=args.depth, lookup=0)
    warm = chat_prompt(model.tokenizer, [{"role": "user", "content": "Explain how a bicycle works."}])
    for _ in range(2):
        model.eagenerate(warm, max_new_tokens=64)
    return model


def main(argv: list[str] | None = None) -> dict:
    p = ab_parser(__doc__, "python -m experiments.draft_int8")
    p.add_argument("--total-token", type=int, default=4)
    p.add_argument("--depth", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ["EAGLE_DRAFT_INT8"] = "auto"
    if not gemv.int8_drafts():
        raise SystemExit("this CPU's draft heads read exact weights (gemv.int8_drafts() is False): nothing to compare")
    models = {choice: load(choice, args) for choice in SIDES}
    prompts = mtbench_sample(models[SIDES[0]].tokenizer, args.prompts)
    ms = {c: [] for c in SIDES}
    tau = {c: [] for c in SIDES}
    outputs = {c: [] for c in SIDES}
    for r in range(args.rounds):
        for ids in prompts:
            for choice in (SIDES if r % 2 == 0 else SIDES[::-1]):
                out = models[choice].eagenerate(ids, max_new_tokens=args.max_new_tokens)
                st = models[choice].last_stats
                ms[choice].append((st.seconds - st.prefill_seconds) * 1e3 / max(1, st.new_tokens - 1))
                tau[choice].append((st.new_tokens - 1) / max(1, st.steps))
                outputs[choice].append(out[0].tolist())
    report = {"head": args.head, "threads": args.threads, "tree": f"{args.total_token}/{args.depth}",
              **{f"ms_per_token_{'int8' if c == 'auto' else 'exact'}": round(statistics.median(ms[c]), 2) for c in SIDES},
              **{f"tau_{'int8' if c == 'auto' else 'exact'}": round(statistics.mean(tau[c]), 3) for c in SIDES},
              "int8_over_exact": round(statistics.median(b / a for a, b in zip(ms["0"], ms["auto"])), 3),
              "same_outputs": outputs["0"] == outputs["auto"]}
    print(json.dumps(report), flush=True)
    return report


if __name__ == "__main__":
    main()
