"""`total_token="auto"`: the EAGLE-2 tree budget and depth that decode fastest on this device.

A bigger tree accepts more tokens per step but costs more to verify, and a deeper draft
costs one more head forward per level; where the optimum lies depends on the hardware
(on a GPU the verify forward is almost free up to ~60 nodes, on a CPU it is not) and on
the head. `tune_tree` measures both sides at load time:

1. **Acceptance.** Greedy decoding of a few calibration prompts, a token at a time. At every
   position the target verifies the best `max(SIZES)` candidates of the largest pool in one forward,
   which tells, for each candidate, whether its whole path matches the target's greedy tokens, and
   the root's own row is committed from that forward (a step that accepts no draft). Because EAGLE-2
   keeps the best `n` candidates by score, and a pool of depth d is the first d levels of the deeper
   pool, the accepted length of *every* (n, d) at that position follows from the one forward: the
   deepest correct node among the n-1 best candidates of depth <= d. The text is the one plain
   decoding writes, whatever the tree, so every configuration walks it as the decoder would
   (`walk_tau`): from a position, accept that tree's length there, move past it, count a step.
2. **Cost.** The wall time of the target forward over n tree tokens and of drafting to depth
   d with the pool width a tree of n nodes needs (`draft_width`: min(top_k, n - 1) children per
   node). Every size (depth, width) is timed in rounds that visit all of them in turn, so a burst
   of load from another process hits all alike; each keeps its fastest round (load only ever adds
   time), and the closest non-decreasing costs to those (`monotone_costs`) remove what is left
   of a burst without assuming a shape: compiled forwards of up to 4 rows run other kernels than
   wider ones (eagle/compiled/target_graphs.py), so cost is not a line in n. Plus the rest of a step
   (acceptance, cache commit, head update): the median over calibration positions of committing
   their token. These parts rank the grid; the best rows are then timed as what they are, real
   decoding steps (eagle/tuning/step_timing.py), and only timed rows are chosen from.

3. **Plain decoding.** The ms per token of the model's own plain step (`naivegenerate`'s
   forward, compiled when the tree's are) over the same context, timed in the same rounds as the
   verify widths: it is the grid's row `total_token=1` (τ = 1, no draft), and `EaModel` decodes a
   one-node tree without lookup by plain steps. Timed apart, back to back, a compiled plain step
   ran ~2 ms faster than between the other forwards (each frozen graph packs its own weights, so
   one graph repeated keeps them warm), and the tuner picked plain steps where a 4-node tree
   decoded 1.15x faster end to end (docs/speed.md). A plain step is a one-row forward, so its cost
   joins the verify widths' non-decreasing fit as width 1 (`forward_costs`). Its row is then timed
   again as real plain steps beside the best trees (step_timing.py), whose figure the choice uses.

4. **The prompt-lookup chain** (eagle/decoding/prompt_lookup.py). Whether a chain of L tokens
   would have been accepted depends only on the greedy text, which calibration has decoded: at
   every position the chain found in the context so far is compared with the tokens that followed
   it, and a tree with a chain accepts the longer of its own path and the chain's matching prefix.
   The walk matters most here: a chain carries a step through a copied stretch at once, so the
   positions inside it never start a step (a mean over the steps of a decoding that advanced by the
   largest tree's length scored several of them, each with a long match, and rated a 2-node tree
   with a 6-token chain at τ 3.20 where decoding got 2.15). A step with a chain verifies n + L rows,
   ranked as the narrowest timed width that holds them (`CHAIN_LENGTHS`); n = 1 with a chain is
   prompt lookup alone, without drafting. A reply copies from itself and from the prompt more the
   longer it runs, so calibration decodes `POSITIONS_PER_PROMPT` tokens of each prompt, and two of
   its six prompts quote text the reply reuses, as real chats do. A prompt's calibration ends at
   its EOS.

The grid ranks by walk τ / (draft(width(n), d) + verify(n + L) + rest); its best rows (eagle/tuning/
step_timing.py: the best of each band of chain lengths, each tree among them also with its best chain)
and plain decoding are then timed as real steps continuing two calibration replies, in the same rounds, and
the choice maximises walk τ / that step time among them;
of the choices within `TOLERANCE` of the best it takes the cheapest step (the smallest tree, plain
decoding first), since timings cannot tell them apart and a small tree costs least when the
estimate is off. So speculation, and the chain, are the default only where this device gains
from them. The grid keeps every chain length, so models that allow shorter chains (`lookup`, the
longest a model may use) pick from the same measurement (`TreeBudget.picked`). A tree picked without a
chain keeps none unless one of its chain rows scores at least as well as the tree alone: the chain
never makes the expected step slower than the head's tree.

The tuner drives a model only through its public step API (`prefill`, `draft_candidates`, `draft`,
`verify`, `commit`, `discard`, `step`; eagle/model.py). `python -m evaluation.tuner_spread --runs 4` tunes
several times in a row and prints each pick, to see how steady the choice is on a machine.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from eagle.compiled.gemv import screened_argmax
from eagle.decoding.prompt_lookup import lookup_chain, matched_length
from eagle.decoding.tree_drafter import draft_width
from eagle.decoding.verify import greedy_ids
from eagle.tuning import step_timing
from eagle.targets.tokenizer import chat_prompt
from eagle.decoding.tree import Tree, build_tree, reindex_parents, select_nodes

log = logging.getLogger("eagle")

SIZES = (8, 12, 16, 24, 32, 48, 64)
COMPILED_SIZES = (2, 4, 8, 16, 32)  # compiled: timed on the target's one dynamic-rows graph
DEPTHS = (1, 2, 3, 4, 5, 6, 7)
PLAIN = "plain"  # the plain step's key among the timed forwards
CHAIN_LENGTHS = (1, 2, 3, 4, 6, 8, 10, 12, 16)  # prompt-lookup chains scored
LOOKUP_LIMIT = max(CHAIN_LENGTHS)
POSITIONS_PER_PROMPT = 96  # calibration positions of each prompt: replies copy from themselves later on
TOLERANCE = 0.03  # choices this close to the best expected tokens/s count as equally fast
# What users ask, by kind: a story, an explanation, a calculation, a list of tips, and two that quote text the
# reply reuses (code to fix, a message to rewrite), as real chats do; without those two the chain's gain scored
# 20 % where chats gain 36-72 % (docs/speed.md, "The chain where calibration says it pays").
CALIBRATION_TEXTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain the difference between a list and a tuple in Python, with examples.",
    "A train travels 120 km in 1.5 hours. What is its average speed? Show your steps.",
    "Give me five tips for staying focused while working from home.",
    "This Python function should return the largest even number in a list, or None when there is none, "
    "but it gives wrong answers. Fix it and explain what was wrong.\n\n"
    "def largest_even(numbers):\n    best = 0\n    for n in numbers:\n        if n % 2 == 0 and n > best:\n"
    "            best = n\n    return best",
    "Rewrite this message so that it sounds formal:\n\nHey team, just a heads up that the office is closed next "
    "Friday because they're fixing the heating. If you need to get stuff done that day, work from home, and tell "
    "your manager by Wednesday so they can plan around it. Thanks!",
)


@dataclass
class TreeBudget:
    """The chosen budget and the measurements behind it."""

    total_token: int
    depth: int
    tokens_per_second: float
    grid: list[dict] = field(default_factory=list)  # one row per (total_token, depth, lookup)
    verify_ms: dict[int, float] = field(default_factory=dict)
    draft_ms: dict[tuple[int, int], float] = field(default_factory=dict)  # (pool width, depth) -> ms
    rest_ms: float = 0.0
    plain_ms: float | None = None  # one plain decoding step (the grid's total_token=1 row)
    accepted: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # (n, d) -> per-position lengths
    lookup: int = 0  # tokens of the prompt-lookup chain merged into each tree (0 = none)
    lookup_ms: float = 0.0  # finding the chain, per step
    copied: list[int] = field(default_factory=list)  # per calibration position: leading chain tokens that match
    ends: list[int] = field(default_factory=list)  # where each calibration text's positions end

    def picked(self, max_lookup: int = LOOKUP_LIMIT) -> "TreeBudget":
        """The same measurements, choosing among the rows whose chain has at most max_lookup tokens. A tree
        picked without a chain (the cheaper of near-equals) gets the chain of up to max_lookup tokens whose
        row scores at least as well as the tree alone, the longest of equals; where every chain is expected
        to slow the tree, none: the chain's rows are verified on every step that finds one."""
        best = choose(self.grid, max_lookup=max_lookup)
        if best["total_token"] > 1 and not best.get("lookup", 0):
            same = [r for r in _timed(self.grid) if r.get("lookup", 0) <= max_lookup and _same_tree(r, best)]
            best = max(same, key=lambda r: (r["tokens_per_s"], r.get("lookup", 0)))
        return replace(self, total_token=best["total_token"], depth=best["depth"], lookup=best.get("lookup", 0),
                       tokens_per_second=best["tokens_per_s"])


def _timed(grid: list[dict]) -> list[dict]:
    """The rows whose cost was timed as real decoding (`time_shortlist`; a grid without marks: every row)."""
    return [r for r in grid if r.get("timed", True)]


def _same_tree(a: dict, b: dict) -> bool:
    return (a["total_token"], a["depth"]) == (b["total_token"], b["depth"])


def tune_tree(model, prompts: list[torch.Tensor] | None = None, sizes=SIZES, depths=DEPTHS,
              positions_per_prompt: int = POSITIONS_PER_PROMPT, repeats: int = 5,
              pause: Callable[[], None] | None = None) -> TreeBudget:
    """Measure acceptance and cost on this device; return the fastest (total_token, depth, lookup),
    where total_token=1, lookup=0 is plain decoding (a model with a shorter `lookup` picks again from
    the grid: `TreeBudget.picked`). pause: called before each timed part (a calibration position, a round
    of forwards)."""
    pause = pause or (lambda: None)
    prompts = prompts if prompts is not None else calibration_prompts(model)
    sizes, depths = sorted(sizes), sorted(depths)
    cal = Calibration.over(sizes, depths)
    state = None
    for ids in prompts:
        state = cal.decode(model, ids, positions_per_prompt, pause)
    forwards: dict[object, Callable[[], None]] = {n: lambda n=n: _verify_only(model, state, n) for n in sizes}
    # timed in the same rounds as the verify widths: alike, or a burst of load favours one side
    model.plain.prefill(state.ids[:, :-1])
    forwards[PLAIN] = lambda: _plain_only(model, state)
    plain_ms, verify_ms = forward_costs(fastest_ms(forwards, repeats, pause))
    width = {n: draft_width(n, model.settings.top_k) for n in sizes}
    draft_ms = _draft_costs(model, state, sorted(set(width.values())), depths, repeats, pause)
    budget = TreeBudget(0, 0, 0.0, [], verify_ms, draft_ms, max(0.0, statistics.median(cal.rest_s) * 1e3), plain_ms,
                        cal.accepted, lookup_ms=statistics.median(cal.lookup_s) * 1e3, copied=cal.copied,
                        ends=cal.ends)
    budget.grid = _grid(budget, {(n, d): draft_ms[(width[n], d)] for n in sizes for d in depths}, depths[0])
    timed = step_timing.timed_contexts(prompts, cal.texts)
    step_timing.time_shortlist(model, budget.grid, timed, max(1, repeats - 2), pause)
    return budget.picked()


@dataclass
class Calibration:
    """What greedy decoding of the calibration prompts measured, one entry per position of their text."""

    sizes: list[int]
    depths: list[int]
    accepted: dict[tuple[int, int], list[int]]  # (n, d) -> what that tree accepts drafted from each position
    copied: list[int] = field(default_factory=list)  # leading tokens of each position's lookup chain that match
    ends: list[int] = field(default_factory=list)  # where each prompt's positions end in those lists
    texts: list[torch.Tensor] = field(default_factory=list)  # each prompt and its greedy text [1, P + T]
    rest_s: list[float] = field(default_factory=list)  # seconds of each position's commit (one token, head update)
    lookup_s: list[float] = field(default_factory=list)  # seconds finding each position's chain

    @classmethod
    def over(cls, sizes: list[int], depths: list[int]) -> "Calibration":
        return cls(sizes, depths, {(n, d): [] for n in sizes for d in depths})

    def decode(self, model, ids: torch.Tensor, positions: int, pause: Callable[[], None] = lambda: None):
        """The greedy text of one prompt [1, P], a token at a time for up to `positions` positions, scoring
        every (n, d) and the chain at each; stops after an EOS: decoding ends there, so later positions would
        score text no reply contains. Returns the last state."""
        state, _ = model.prefill(ids)
        contexts = []  # committed tokens at each position
        for _ in range(positions):
            pause()
            contexts.append(state.ids.shape[1])
            state, seconds = _calibration_step(model, state, self.sizes, self.depths, self.accepted)
            self.rest_s.append(seconds)
            if int(state.ids[0, -1]) in model.eos_ids:
                break
        _copied_lengths(state.ids[0].cpu(), contexts, self.copied, self.lookup_s)
        self.ends.append(len(self.copied))
        self.texts.append(state.ids)
        return state


def _grid(b: TreeBudget, draft: dict[tuple[int, int], float], first_depth: int) -> list[dict]:
    """A row per (total_token, depth, lookup): expected tokens per step (tau), ms per step, tokens/s.
    draft: ms of drafting the tree of (n, d)."""
    def row(n, d, lookup, lengths, ms):
        tau = walk_tau(lengths, b.copied, b.ends, lookup)
        ms += b.rest_ms + (b.lookup_ms if lookup else 0.0)
        return {"total_token": n, "depth": d, "lookup": lookup, "tau": tau, "ms_per_step": ms,
                "tokens_per_s": 1e3 * tau / ms}

    grid = [row(n, d, lookup, lengths, draft[(n, d)] + verify_cost(b.verify_ms, n + lookup))
            for (n, d), lengths in b.accepted.items() for lookup in chain_lengths(n, b.verify_ms)]
    alone = [1] * len(b.copied)  # prompt lookup without drafting: the root, and the chain
    grid += [row(1, first_depth, lookup, alone, verify_cost(b.verify_ms, 1 + lookup))
             for lookup in chain_lengths(1, b.verify_ms) if lookup]
    grid.append({"total_token": 1, "depth": first_depth, "lookup": 0, "tau": 1.0, "ms_per_step": b.plain_ms,
                 "tokens_per_s": 1e3 / b.plain_ms})
    return grid


def walk_tau(accepted: list[int], copied: list[int], ends: list[int], lookup: int) -> float:
    """Mean tokens a step of a tree with a `lookup`-token chain accepts, walking each calibration text as the
    decoder would (`walk_steps`). A chain carries a step through a copied stretch at once, so the positions
    inside it are never a step's start: a mean over every position would count them."""
    steps = walk_steps(accepted, copied, ends, lookup)
    return ends[-1] / len(steps) if steps else 1.0


def walk_steps(accepted: list[int], copied: list[int], ends: list[int], lookup: int) -> list[int]:
    """The positions where the decoder's steps start: from a position, the longer of the tree's own path
    (accepted[p], root and bonus included) and the root plus the chain's matching prefix
    (1 + min(copied[p], lookup)), then past them. ends: where each text's positions end."""
    steps, start = [], 0
    for end in ends:
        position = start
        while position < end:
            steps.append(position)
            position += max(accepted[position], 1 + min(copied[position], lookup))
        start = end
    return steps


def chain_lengths(n: int, widths) -> list[int]:
    """0, and each of CHAIN_LENGTHS whose verify of n + L rows fits within a timed width."""
    return [0] + [lookup for lookup in CHAIN_LENGTHS if n + lookup <= max(widths)]


def verify_cost(verify_ms: dict[int, float], rows: int) -> float:
    """The ms of a verify of `rows` rows: the narrowest timed width that holds them (costs only rise with
    the width, so an untimed width between two costs at most the wider one)."""
    return verify_ms[min(w for w in verify_ms if w >= rows)]


def _copied_lengths(ids: torch.Tensor, contexts: list[int], copied: list[int], seconds: list[float]) -> None:
    """For each step's context length m: how many leading tokens of the LOOKUP_LIMIT-token chain found in
    ids[:m] are the greedy tokens that followed (ids[m:], as far as calibration decoded), appended to
    copied; the seconds finding each chain took, to seconds. ids [L]"""
    for m in contexts:
        start = time.perf_counter()
        chain = lookup_chain(ids[:m], LOOKUP_LIMIT)
        seconds.append(time.perf_counter() - start)
        copied.append(matched_length(chain, ids[m: m + chain.numel()]))


def choose(grid: list[dict], tolerance: float = TOLERANCE, max_lookup: int = LOOKUP_LIMIT) -> dict:
    """The cheapest grid row whose expected tokens/s is within `tolerance` of the best, among the rows
    whose chain has at most max_lookup tokens; of equally cheap trees, the longest chain (it verifies
    within the same timed width, and the decoder merges it only where it pays)."""
    grid = [r for r in _timed(grid) if r.get("lookup", 0) <= max_lookup]
    best = max(r["tokens_per_s"] for r in grid)
    close = [r for r in grid if r["tokens_per_s"] >= (1 - tolerance) * best]
    return min(close, key=lambda r: (r["ms_per_step"], r["total_token"], r["depth"], -r.get("lookup", 0)))


def fastest_ms(fns: dict[object, Callable[[], None]], rounds: int,
               pause: Callable[[], None] = lambda: None) -> dict[object, float]:
    """Each fn's fastest wall time in ms over `rounds` rounds that call every fn in turn, after a warm-up round
(`pause` before each call).

    Interleaving spreads a burst of outside load over all keys instead of one; the fastest
    round is the one least disturbed (load only ever adds time)."""
    best = {key: float("inf") for key in fns}
    for r in range(rounds + 1):
        for key, fn in fns.items():
            pause()
            start = time.perf_counter()
            fn()
            if r:
                best[key] = min(best[key], (time.perf_counter() - start) * 1e3)
    return best


def forward_costs(ms: dict[object, float]) -> tuple[float, dict[int, float]]:
    """(plain step ms, {verify width: ms}) from the fastest timings of both: the plain step is one row,
    so it joins the widths' `monotone_costs` as width 1 (a plain step timed above a 2-row verify was a
    burst of load, and made the tuner pick a 2-node tree that decoded at 0.95x plain speed)."""
    costs = monotone_costs({1 if key == PLAIN else key: v for key, v in ms.items()})
    return costs.pop(1), costs


def monotone_costs(ms: dict[int, float]) -> dict[int, float]:
    """The non-decreasing costs closest (least squares) to measured {x: ms}: more never costs less.

    Pools adjacent violators: a cost above a later one is averaged with it, so a single slow
    measurement is shared out instead of kept, and costs that already rise are kept as measured."""
    xs = sorted(ms)
    blocks: list[list[float]] = []  # [sum, count] of pooled neighbours, in x order
    for x in xs:
        blocks.append([ms[x], 1])
        while len(blocks) > 1 and blocks[-2][0] * blocks[-1][1] > blocks[-1][0] * blocks[-2][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    costs = [total / count for total, count in blocks for _ in range(int(count))]
    return dict(zip(xs, costs, strict=True))


def calibration_prompts(model) -> list[torch.Tensor]:
    """Chat prompts through the tokenizer's template, or seeded random ids without a tokenizer."""
    if model.tokenizer is not None and getattr(model.tokenizer, "chat_template", None):
        return [chat_prompt(model.tokenizer, [{"role": "user", "content": t}]) for t in CALIBRATION_TEXTS]
    vocab = model.target.get_input_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (1, 12), generator=gen) for _ in CALIBRATION_TEXTS]


def _calibration_step(model, state, sizes, depths, accepted) -> tuple[object, float]:
    """Score every (n, d) at this position, then advance the greedy text by the root's own token, from the
    same verify (a step that accepted no draft). Returns (state, seconds of that commit)."""
    tree, verified, greedy = score_trees(model, state, sizes, depths, accepted)
    start = time.perf_counter()
    state, _ = model.commit(state, tree, verified, torch.zeros(1, dtype=torch.long), int(greedy[0]))
    return state, time.perf_counter() - start


def score_trees(model, state, sizes, depths, accepted) -> tuple[Tree, object, torch.Tensor]:
    """Append to accepted[(n, d)] the length every tree of n nodes and depth <= d would accept from this state:
    the largest pool verified in one target forward, its rows left in the target cache for the caller to
    commit or discard. Returns that pool's tree, the verify's output and each node's greedy next token [N]."""
    tokens, scores, parents = model.draft_candidates(state, depths[-1])  # [M]
    kept = select_nodes(scores, parents, sizes[-1] - 1)
    tree = build_tree(torch.cat([state.root, tokens[kept]]), reindex_parents(kept, parents))
    verified = model.verify(state, tree)
    greedy = greedy_ids(verified.logits).cpu()  # [N]
    correct = _correct_candidates(tree, greedy, kept, scores.numel())  # [M] bool
    depth = _depths(parents)  # [M]
    for d in depths:
        in_pool = (depth <= d).nonzero().flatten()
        order = in_pool[torch.sort(scores[in_pool], descending=True, stable=True).indices]
        for n in sizes:
            chosen = order[: n - 1]
            ok = correct[chosen]
            accepted[(n, d)].append(1 + (int(depth[chosen][ok].max()) if bool(ok.any()) else 0))
    return tree, verified, greedy


def _correct_candidates(tree: Tree, best: torch.Tensor, kept: torch.Tensor, m: int) -> torch.Tensor:
    """[M] bool: candidate is in the tree and its whole root-to-node path is the target's greedy choice."""
    node_ok = torch.zeros(tree.size, dtype=torch.bool)
    node_ok[0] = True
    for i in range(1, tree.size):  # parents before children
        p = int(tree.parents[i])
        node_ok[i] = bool(node_ok[p]) and int(tree.tokens[i]) == int(best[p])
    out = torch.zeros(m, dtype=torch.bool)
    out[kept] = node_ok[1:]
    return out


def _depths(parents: torch.Tensor) -> torch.Tensor:
    """Depth of each candidate (1 for the root's children), parents listed first. [M]"""
    depth = torch.ones(parents.numel(), dtype=torch.long)
    for i, p in enumerate(parents.tolist()):
        if p >= 0:
            depth[i] = depth[p] + 1
    return depth


def _verify_only(model, state, n: int) -> None:
    """One target forward over an n-token tree (a chain repeating the root), then drop its rows."""
    chain = build_tree(state.root.expand(n).contiguous(), torch.arange(-1, n - 1))
    with screened_argmax(True):  # as a greedy step's
        model.verify(state, chain)
    model.discard(state)


def _draft_costs(model, state, widths: list[int], depths: list[int], rounds: int,
                 pause: Callable[[], None]) -> dict[tuple[int, int], float]:
    """{(width, depth): ms} of drafting pools of each width (children per node) and depth; monotone in depth."""
    ms = fastest_ms({(k, d): lambda k=k, d=d: model.draft_candidates(state, d, k) for k in widths for d in depths},
                    rounds, pause)
    out = {}
    for k in widths:
        out.update({(k, d): v for d, v in monotone_costs({d: ms[(k, d)] for d in depths}).items()})
    return out


def _plain_only(model, state) -> None:
    """One plain decoding step (`naivegenerate`'s forward) of the state's root, after the context
    `tune_tree` prefilled the plain step with. Each call continues the last: the context grows by a
    row a round, which changes a step's cost by nothing measurable (a compiled target shares its
    static cache with the state, and no mask of the state's shows rows past its committed ones)."""
    with screened_argmax(True):  # as a greedy step's
        model.plain(state.root)


def describe(budget: TreeBudget) -> str:
    """One log line per depth: each size's expected tokens/s without a chain; and the best row with one."""
    lines = [f"tree budget: total_token={budget.total_token} depth={budget.depth} lookup={budget.lookup} "
             f"(expected {budget.tokens_per_second:.1f} tok/s; rest of step {budget.rest_ms:.1f} ms)",
             "  verify: " + ", ".join(f"n={n} {ms:.1f} ms" for n, ms in sorted(budget.verify_ms.items()))]
    if budget.plain_ms is not None:
        lines.append(f"  plain decoding: {budget.plain_ms:.1f} ms/token ({1e3 / budget.plain_ms:.0f}/s)")
    trees = [r for r in budget.grid if r["total_token"] > 1 and not r.get("lookup")]
    for d in sorted({r["depth"] for r in trees}):
        rows = [r for r in trees if r["depth"] == d]
        drafts = ", ".join(f"width {k} {ms:.1f}" for (k, dd), ms in sorted(budget.draft_ms.items()) if dd == d)
        lines.append(f"  depth {d} (draft ms: {drafts}): " + ", ".join(
            f"n={r['total_token']} τ={r['tau']:.2f} {r['tokens_per_s']:.0f}/s" for r in rows))
    chains = [r for r in budget.grid if r.get("lookup")]
    if chains:
        r = max(chains, key=lambda r: r["tokens_per_s"])
        lines.append(f"  best with a lookup chain: n={r['total_token']} depth {r['depth']} lookup {r['lookup']} "
                     f"τ={r['tau']:.2f} {r['tokens_per_s']:.0f}/s")
    timed = sorted((r for r in budget.grid if "parts_ms" in r), key=lambda r: -r["tokens_per_s"])
    if timed:
        lines.append("  timed as decoding (ms a step; the parts' sum): " + ", ".join(
            f"{r['total_token']}/{r['depth']}+{r['lookup']} τ={r['tau']:.2f} {r['ms_per_step']:.1f} "
            f"({r['parts_ms']:.1f}) {r['tokens_per_s']:.0f}/s" for r in timed))
    return "\n".join(lines)
