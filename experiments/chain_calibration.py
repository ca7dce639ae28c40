"""What does the tuner's calibration say a tree and a prompt-lookup chain accept, by calibration length and
prompt set?

    python -m experiments.chain_calibration [--head DIR] [--positions 48 96] [--per-category 1] [--sharegpt 8]
                                            [--humaneval 8]

The tuner (eagle/tuning/tuner.py) decodes the greedy text of its calibration prompts a token at a time,
scores every tree and the chain at every position, and walks each configuration over the text as the decoder
would (`tuner.walk_tau`). This runs that calibration (eager forwards, no timing) on its own prompts and on the
first turns of MT-bench, held-out ShareGPT and HumanEval, for several numbers of positions per prompt, and
prints the walk's τ of a few trees alone and with a 4-, 6- and 10-token chain: how well the calibration
prompts stand for each set. Greedy decoding is deterministic, so the figures do not depend on the machine's
load.
"""

from __future__ import annotations

import torch

from data_prep.prompt_sets import load_questions
from eagle.decoding.settings import TreeSettings
from eagle.heads.checkpoint import load_head
from eagle.model import EaModel
from eagle.tuning import tuner
from experiments.diagnostic_prompts import first_turn_ids, parser, setup

TREES = ((1, 1), (2, 1), (4, 2), (8, 3), (8, 4), (16, 4))  # (total_token, depth) reported; 1: lookup alone
CHAINS = (0, 4, 6, 10)


def calibrate(model: EaModel, prompts: list[torch.Tensor], positions: int) -> tuner.Calibration:
    """The tuner's calibration of these prompts, up to `positions` positions each (it stops a prompt at its
    EOS)."""
    cal = tuner.Calibration.over(sorted(tuner.COMPILED_SIZES), sorted(tuner.DEPTHS))
    for ids in prompts:
        cal.decode(model, ids, positions)
    return cal


def predicted_row(cal: tuner.Calibration) -> str:
    """`n/d: τ +L τ ...` for each reported tree, alone and with each chain (`tuner.walk_tau`)."""
    cells = []
    for n, d in TREES:
        lengths = cal.accepted[(n, d)] if n > 1 else [1] * len(cal.copied)
        taus = [tuner.walk_tau(lengths, cal.copied, cal.ends, chain) for chain in CHAINS if n > 1 or chain]
        chains = CHAINS if n > 1 else CHAINS[1:]
        cells.append(f"{n}/{d}: " + " ".join(f"+{c} {t:.2f}" for c, t in zip(chains, taus)))
    return "; ".join(cells)


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__, "python -m experiments.chain_calibration")
    ap.add_argument("--head", default="checkpoints/eagle3-smollm2-135m-instruct")
    ap.add_argument("--positions", type=int, nargs="+", default=[48, tuner.POSITIONS_PER_PROMPT])
    ap.add_argument("--humaneval", type=int, default=8, help="HumanEval prompts (the first ones)")
    ap.set_defaults(per_category=1, sharegpt=8)
    args = ap.parse_args(argv)
    tok, target, sets = setup(args)
    model = EaModel(target, load_head(args.head, dtype=target.dtype), tok,
                    TreeSettings(total_token=max(tuner.COMPILED_SIZES), depth=max(tuner.DEPTHS)), compile=False)
    prompts = {"calibration": tuner.calibration_prompts(model)}
    prompts.update({name: [first_turn_ids(tok, q) for q in questions] for name, questions in sets.items()})
    if args.humaneval:
        prompts["humaneval"] = [first_turn_ids(tok, q) for q in load_questions("humaneval")[: args.humaneval]]
    with torch.inference_mode():
        for name, ids in prompts.items():
            for positions in args.positions:
                print(f"{name}, {len(ids)} prompts x {positions} positions: "
                      f"{predicted_row(calibrate(model, ids, positions))}", flush=True)


if __name__ == "__main__":
    main()
