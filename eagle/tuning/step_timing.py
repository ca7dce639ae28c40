"""The tuner's last word on cost: the best rows of its grid timed as real decoding steps.

The tuner (eagle/tuning/tuner.py) ranks every (total_token, depth, lookup) by its walked τ over a cost summed
from timed parts (the draft, the verify of n + L rows, the rest of a step). That sum misses what differs
between real steps, so `time_shortlist` times the best rows of each band of chain lengths as what they are,
and the tuner chooses among those alone.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch

from eagle.compiled.gemv import screened_argmax
from eagle.decoding.verify import greedy_ids

SHORTLIST = 2  # the grid's best rows of each band of chain lengths, timed as real decoding steps
CHAIN_BANDS = ((0, 0), (1, 4), (5, 10), (11, math.inf))  # chain lengths, shortest and longest, of each band
TIMED_STEPS = 12  # decoding steps timed per prompt and round for each shortlisted row
TIMED_PROMPTS = (1, 4)  # which calibration prompts those steps decode: one that quotes nothing, one that does
TIMED_AFTER = 48  # tokens of the calibration's own reply the timed steps continue from


def timed_contexts(prompts: list[torch.Tensor], texts: list[torch.Tensor]) -> list[torch.Tensor]:
    """The contexts the timed steps continue: TIMED_PROMPTS' prompts with the first TIMED_AFTER tokens of the
    reply calibration decoded for them (fewer if it ended sooner, its last token left out). A reply's first
    steps find few chains to copy; steps halfway into it find them as decoding does, and pay their rows."""
    picked = [i for i in TIMED_PROMPTS if i < len(prompts)] or [0]
    return [texts[i][:, : prompts[i].shape[1] + min(TIMED_AFTER, texts[i].shape[1] - prompts[i].shape[1] - 1)]
            for i in picked]


def time_shortlist(model, grid: list[dict], prompts: list[torch.Tensor], rounds: int,
                   pause: Callable[[], None]) -> None:
    """Time the best rows of the grid (the SHORTLIST best of each band of chain lengths, and each tree among them
    without a chain with its best chain) as real decoding (`model.draft` + `model.step`, TIMED_STEPS steps of
    each prompt after its prefill, in rounds that visit every row in turn) and set their ms_per_step and
    tokens_per_s to what that measured, marked `timed`; the other rows are marked untimed, and `choose` leaves
    them out. The grid's costs add up timed parts and miss what differs between real steps: a step whose
    context holds no chain verifies the tree alone, a small tree accepts, commits and updates the head over
    fewer rows (the parts priced the 2-node tree with a 6-token chain 1.8x a plain step where it ran 1.5x).
    Plain decoding is timed the same way in the same rounds: the parts' forwards, timed a minute before,
    ran 25 % faster than decoding did once (a plain step 7.8 ms, then 10.2), which made plain steps look as
    fast as the EAGLE-2 head's best tree. Each step keeps its fastest round (the same text, so the same work,
    every round): a burst of load lengthens a few steps of one round, not the row's whole figure."""
    short = shortlist(grid)
    plain = next(r for r in grid if r["total_token"] == 1 and not r["lookup"])
    short[_row_key(plain)] = plain  # timed beside them: host speed drifts between the parts' rounds and these
    saved, fastest = model.settings, {}
    try:
        for round_ in range(rounds + 1):  # a warm-up round first: a row's first steps may compile a shape
            for key, r in short.items():
                seconds = (_step_seconds(prompts, model.plain.prefill, _plain_step(model), pause) if r is plain
                           else _step_seconds(prompts, *_tree_step(model, saved.tuned(*key)), pause))
                if round_:
                    fastest[key] = [min(a, b) for a, b in zip(fastest.get(key, seconds), seconds, strict=True)]
    finally:
        model.settings = saved
    for r in grid:
        r["timed"] = _row_key(r) in short
        if _row_key(r) in short:
            r["parts_ms"] = r["ms_per_step"]  # what the parts' sum expected, kept for the log
            r["ms_per_step"] = 1e3 * statistics.fmean(fastest[_row_key(r)])
            r["tokens_per_s"] = 1e3 * r["tau"] / r["ms_per_step"]


def shortlist(grid: list[dict]) -> dict[tuple[int, int, int], dict]:
    """{(total_token, depth, lookup): row} of the rows to time: the SHORTLIST best by the parts' sum in each
    band of chain lengths (the sum misranks across chain lengths, so each band has its best timed), and each
    tree among them without a chain with its best chain row."""
    trees = [r for r in grid if r["total_token"] > 1 or r["lookup"]]
    short = {}
    for low, high in CHAIN_BANDS:
        band = sorted((r for r in trees if low <= r["lookup"] <= high), key=lambda r: -r["tokens_per_s"])
        short.update({_row_key(r): r for r in band[:SHORTLIST]})
    # each tree among those without a chain, with its best chain too: `picked` may attach it
    for n, d, _ in [key for key in short if not key[2]]:
        chained = [r for r in trees if (r["total_token"], r["depth"]) == (n, d) and r["lookup"]]
        if chained:
            best = max(chained, key=lambda r: r["tokens_per_s"])
            short[_row_key(best)] = best
    return short


def _step_seconds(prompts: list[torch.Tensor], begin: Callable, step: Callable,
                  pause: Callable[[], None]) -> list[float]:
    """Seconds of each of TIMED_STEPS decoding steps of each prompt: `state = begin(ids)` (a prefill,
    untimed), then `state = step(state)` timed, `pause` before each."""
    seconds = []
    for ids in prompts:
        state = begin(ids)
        for _ in range(TIMED_STEPS):
            pause()
            start = time.perf_counter()
            state = step(state)
            seconds.append(time.perf_counter() - start)
    return seconds


def _tree_step(model, settings) -> tuple[Callable, Callable]:
    """(begin, step) of tree decoding with these settings: the model's prefill, then draft and step."""
    model.settings = settings
    return (lambda ids: model.prefill(ids)[0]), (lambda state: model.step(state, model.draft(state))[0])


def _plain_step(model) -> Callable:
    """A plain decoding step (`naivegenerate`'s greedy forward and pick) from the last logits [V]."""

    def step(logits: torch.Tensor) -> torch.Tensor:
        with screened_argmax(True):
            return model.plain(greedy_ids(logits[None]))
    return step


def _row_key(r: dict) -> tuple[int, int, int]:
    return r["total_token"], r["depth"], r["lookup"]
