"""How far is the tuner's expected τ from the τ a decoder gets walking the same greedy text?

    python -m experiments.walk_calibration [--head DIR] [--per-category 2] [--humaneval 16] [--max-new-tokens 128]

The tuner (eagle/tuning/tuner.py) scores every tree and chain on the steps of its calibration decoding, which
advance by the largest tree's accepted length, and takes the mean over those steps. A decoder advances by its own
accepted length: a chain carries it through a copied stretch in one step, where calibration scores several
positions of the same stretch, each with a long match. This decodes the greedy text one token at a time, scores
every tree at every position (the tuner's own `score_trees`: the largest pool, verified), and replays each
configuration's walk over the text: from a position, accept the longer of the tree's path and the chain's matching
prefix, move past it, count a step. It prints, per configuration, the walk's τ (what the decoder gets, up to the
near-ties of the dtype), the tuner's estimator over the same text (`sampled`: the mean at the positions the largest
tree's walk lands on, as calibration steps do) and the tuner's own estimate, whose text comes from steps that
commit several tokens at once (so at a near-tie of the dtype it may write another reply). Greedy decoding is
deterministic: the figures do not depend on the machine's load.
"""

from __future__ import annotations

import torch

from data_prep.prompt_sets import load_questions
from eagle.decoding.prompt_lookup import lookup_chain, matched_length
from eagle.decoding.settings import TreeSettings
from eagle.decoding.tree import build_tree
from eagle.heads.checkpoint import load_head
from eagle.model import EaModel
from eagle.tuning import tuner
from experiments.diagnostic_prompts import first_turn_ids, parser, setup

SIZES, DEPTHS = tuner.COMPILED_SIZES, tuner.DEPTHS
CONFIGS = ((2, 1, 0), (2, 1, 6), (1, 1, 6), (4, 2, 0), (4, 2, 4), (8, 4, 0), (8, 4, 6))  # (n, depth, chain)


def per_position(model: EaModel, ids: torch.Tensor, new_tokens: int) -> tuple[dict, list[int]]:
    """Greedy text of a prompt [1, P], one token a step, every (n, d) scored at every position, stopping after
    an EOS. Returns ({(n, d): accepted length at each position}, chain match at each position)."""
    accepted = {(n, d): [] for n in SIZES for d in DEPTHS}
    state, _ = model.prefill(ids)
    first = state.ids.shape[1]  # the context of the first position: the prompt and the root
    for _ in range(new_tokens - 1):
        tuner.score_trees(model, state, SIZES, DEPTHS, accepted)
        before = state.ids.shape[1]
        state, _ = model.step(state, build_tree(state.root, torch.tensor([-1])))  # the root's greedy token only
        if not model.eos_ids.isdisjoint(state.ids[0, before:].tolist()):
            break
    text = state.ids[0].cpu()
    copied = []
    for m in range(first, first + len(accepted[(SIZES[0], DEPTHS[0])])):
        chain = lookup_chain(text[:m], tuner.LOOKUP_LIMIT)
        copied.append(matched_length(chain, text[m: m + chain.numel()]))
    return accepted, copied


def walk(accepted: list[int] | None, copied: list[int], lookup: int) -> tuple[int, int]:
    """(tokens, steps) of a decoder walking one text: at each step it accepts the longer of the tree's path
    (accepted[p], root and bonus included) and the root plus the chain's matching prefix, and moves past them.
    accepted=None: prompt lookup alone (the tree is the root)."""
    position = steps = 0
    while position < len(copied):
        tree = accepted[position] if accepted is not None else 1
        position += max(tree, 1 + min(copied[position], lookup))
        steps += 1
    return len(copied), steps


def sampled_tau(texts: list[tuple[dict, list[int]]], n: int, d: int, lookup: int, steps: int) -> float:
    """The tuner's estimator over these texts: the mean accepted length of (n, d, lookup) at the positions the
    largest tree's walk lands on, its first `steps` of each text (`tuner.chained_tau`)."""
    largest, accepted, copied = (max(SIZES), max(DEPTHS)), [], []
    for scores, matches in texts:
        position = 0
        for _ in range(steps):
            if position >= len(matches):
                break
            accepted.append(scores[(n, d)][position] if n > 1 else 1)
            copied.append(matches[position])
            position += scores[largest][position]
    return tuner.chained_tau(accepted, copied, lookup)


def walk_tau(texts: list[tuple[dict, list[int]]], n: int, d: int, lookup: int) -> float:
    """τ of (n, d, lookup) over several texts' walks (n = 1: prompt lookup alone)."""
    tokens = steps = 0
    for accepted, copied in texts:
        t, s = walk(accepted[(n, d)] if n > 1 else None, copied, lookup)
        tokens, steps = tokens + t, steps + s
    return tokens / steps


def tuner_tau(model: EaModel, prompts: list[torch.Tensor]) -> dict[tuple[int, int, int], float]:
    """The tuner's expected τ of each configuration (`tuner.Calibration`, `tuner.chained_tau`) on these prompts."""
    cal = tuner.Calibration.over(list(SIZES), list(DEPTHS))
    for ids in prompts:
        cal.decode(model, ids, tuner.STEPS_PER_PROMPT)
    alone = [1] * len(cal.copied)
    return {(n, d, lookup): tuner.chained_tau(cal.accepted[(n, d)] if n > 1 else alone, cal.copied, lookup)
            for n, d, lookup in CONFIGS}


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__, "python -m experiments.walk_calibration")
    ap.add_argument("--head", default="checkpoints/eagle3-smollm2-135m-instruct")
    ap.add_argument("--humaneval", type=int, default=16, help="HumanEval prompts (the first ones)")
    ap.set_defaults(sharegpt=0)
    args = ap.parse_args(argv)
    tok, target, sets = setup(args)
    model = EaModel(target, load_head(args.head, dtype=target.dtype), tok,
                    TreeSettings(total_token=max(SIZES), depth=max(DEPTHS)), compile=False)
    prompts = {"calibration": tuner.calibration_prompts(model)}
    prompts.update({name: [first_turn_ids(tok, q) for q in questions] for name, questions in sets.items()})
    if args.humaneval:
        prompts["humaneval"] = [first_turn_ids(tok, q) for q in load_questions("humaneval")[: args.humaneval]]
    with torch.inference_mode():
        for name, ids in prompts.items():
            expected = tuner_tau(model, ids)
            texts = [per_position(model, x, args.max_new_tokens) for x in ids]
            cells = [f"{n}/{d}+{lookup}: walk {walk_tau(texts, n, d, lookup):.2f}, "
                     f"sampled {sampled_tau(texts, n, d, lookup, tuner.STEPS_PER_PROMPT):.2f}, "
                     f"tuner {expected[(n, d, lookup)]:.2f}" for n, d, lookup in CONFIGS]
            print(f"{name}, {len(ids)} prompts: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
