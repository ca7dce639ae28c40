"""How much does the tuner's calibration say a prompt-lookup chain adds, by calibration length and prompt set?

    python -m experiments.chain_calibration [--head DIR] [--steps 16 48] [--per-category 1] [--sharegpt 8]

The tuner (eagle/tuning/tuner.py) scores a chain from the greedy text its calibration decoded: at each
step, the chain found in the context so far against the tokens that followed. This runs the tuner's
own calibration steps (the largest pool, eager forwards, no timing) on its calibration prompts and on
the first turns of MT-bench and held-out ShareGPT, for several numbers of steps per prompt, and prints
the predicted τ of a few trees alone and with a 4-, 8- and 16-token chain. Greedy decoding is
deterministic, so the figures do not depend on the machine's load.
"""

from __future__ import annotations

import statistics

import torch

from eagle.decoding.settings import TreeSettings
from eagle.heads.checkpoint import load_head
from eagle.model import EaModel
from eagle.tuning import tuner
from experiments.diagnostic_prompts import first_turn_ids, parser, setup

TREES = ((8, 2), (16, 3), (24, 3))  # (total_token, depth) reported
CHAINS = (4, 8, 16)


def calibrate(model: EaModel, prompts: list[torch.Tensor], steps: int) -> tuple[dict, list[int]]:
    """The tuner's per-step accepted lengths {(n, d): [..]} and chain matches [..] over up to `steps` steps a
    prompt (`tuner.Calibration`, which stops a prompt at its EOS)."""
    cal = tuner.Calibration.over(sorted(tuner.SIZES), sorted(tuner.DEPTHS))
    for ids in prompts:
        cal.decode(model, ids, steps)
    return cal.accepted, cal.copied


def predicted_row(accepted: dict, copied: list[int]) -> str:
    """`n/d: τ -> +L τ ...` for each reported tree, alone and with each chain (`tuner.chained_tau`)."""
    cells = []
    for n, d in TREES:
        alone = statistics.fmean(accepted[(n, d)])
        chained = [tuner.chained_tau(accepted[(n, d)], copied, length) for length in CHAINS]
        cells.append(f"{n}/{d}: {alone:.2f} -> " + " ".join(f"+{length} {t:.2f}" for length, t in zip(CHAINS, chained))
                     + f" ({chained[1] / alone:.2f}x with 8)")
    return "; ".join(cells)


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__, "python -m experiments.chain_calibration")
    ap.add_argument("--head", default="checkpoints/eagle3-smollm2-135m-instruct")
    ap.add_argument("--steps", type=int, nargs="+", default=[16, tuner.STEPS_PER_PROMPT])
    ap.set_defaults(per_category=1, sharegpt=8)
    args = ap.parse_args(argv)
    tok, target, sets = setup(args)
    model = EaModel(target, load_head(args.head, dtype=target.dtype), tok,
                    TreeSettings(total_token=max(tuner.SIZES), depth=max(tuner.DEPTHS)), compile=False)
    prompts = {"calibration": tuner.calibration_prompts(model)}
    prompts.update({name: [first_turn_ids(tok, q) for q in questions] for name, questions in sets.items()})
    with torch.inference_mode():
        for name, ids in prompts.items():
            for steps in args.steps:
                print(f"{name}, {len(ids)} prompts x {steps} steps: {predicted_row(*calibrate(model, ids, steps))}",
                      flush=True)


if __name__ == "__main__":
    main()
