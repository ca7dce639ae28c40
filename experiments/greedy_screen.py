"""`python -m experiments.greedy_screen`: greedy decoding with the target's lm_head screened against exact, in one
process, for plain steps and fixed trees.

    python -m experiments.greedy_screen [--head DIR] [--threads 2] [--configs plain,2/1,4/2] [--prompts 8] [--rounds 3]

Where the GEMV runs its AVX2 form in the fp32 kind, a greedy step of up to `gemv.SCREEN_ROWS` rows reads the
lm_head's int8 codes first and scores only the tokens that may be the argmax (eagle/compiled/gemv.py
`screened_argmax`). The target's graphs hold the screened op either way; EAGLE_GREEDY_SCREEN, read at every step,
decides whether a step screens, so both sides run the same graphs of one model. Each round decodes every prompt
(MT-bench first turns, one in ten) with each configuration (`plain`: plain steps; `N/D`: an N-node tree of depth
D, no lookup chain) on both sides, in alternating order, after an untimed pass that compiles every shape. Prints,
per configuration, each side's median ms a step after the prefill, the median of the paired per-prompt ratios
(screened / exact), and whether the outputs were equal (they must be: the screen keeps the argmax exact).
"""

from __future__ import annotations

import json
import os
import statistics

import torch

from eagle.compiled import gemv
from eagle.model import EaModel
from experiments.diagnostic_prompts import ab_parser, mtbench_sample
from experiments.tree_ab import PLAIN, decode, settings_of

SIDES = ("0", "auto")  # EAGLE_GREEDY_SCREEN: exact, then screened


def run(model: EaModel, config: str, side: str, ids: torch.Tensor, max_new_tokens: int) -> dict:
    """One greedy generation of `config` with the screen `side` (EAGLE_GREEDY_SCREEN)."""
    os.environ["EAGLE_GREEDY_SCREEN"] = side
    settings = None if config == PLAIN else settings_of(config, model.settings)
    return decode(model, settings, ids, max_new_tokens)


def main(argv: list[str] | None = None) -> dict:
    p = ab_parser(__doc__, "python -m experiments.greedy_screen")
    p.add_argument("--configs", default="plain,2/1,4/2")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ["EAGLE_GREEDY_SCREEN"] = "auto"
    if not gemv.screens():
        raise SystemExit("this CPU's greedy steps read the exact lm_head (gemv.screens() is False): nothing to compare")
    model = EaModel.from_pretrained(args.base, args.head, torch_dtype=torch.float32, background=False, quiet=True,
                                    total_token=4, depth=2, lookup=0)
    prompts = mtbench_sample(model.tokenizer, args.prompts)
    configs = args.configs.split(",")
    for config in configs:  # compiles every shape
        run(model, config, "auto", prompts[0], 32)
    ms = {(c, s): [] for c in configs for s in SIDES}
    outputs = {(c, s): [] for c in configs for s in SIDES}
    for r in range(args.rounds):
        for ids in prompts:
            for config in configs:
                for side in (SIDES if r % 2 == 0 else SIDES[::-1]):
                    out = run(model, config, side, ids, args.max_new_tokens)
                    ms[config, side].append(out["step_ms"])
                    outputs[config, side].append(out["new"])
    os.environ["EAGLE_GREEDY_SCREEN"] = "auto"
    report = {"head": args.head, "threads": args.threads, "configs": {}}
    for c in configs:
        report["configs"][c] = {
            "step_ms_exact": round(statistics.median(ms[c, "0"]), 2),
            "step_ms_screened": round(statistics.median(ms[c, "auto"]), 2),
            "screened_over_exact": round(statistics.median(b / a for a, b in zip(ms[c, "0"], ms[c, "auto"])), 3),
            "same_outputs": outputs[c, "0"] == outputs[c, "auto"]}
    print(json.dumps(report), flush=True)
    return report


if __name__ == "__main__":
    main()
