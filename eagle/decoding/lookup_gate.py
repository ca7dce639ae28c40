"""Whether the prompt-lookup chain pays in this generation: `LookupGate`.

A chain of L tokens makes a step verify n + L rows instead of n; it pays only where the reply
copies from its context (code, extraction, lists, a model repeating itself), which the tuner's
calibration prompts cannot know. So the chain is looked up at every step but merged into the
tree only while it has paid over the last `WINDOW` steps of this generation:

    gain = mean(max(a, 1 + c) - a)  >  extra_cost * mean(a)

a: the tokens the head's tree alone accepted at a step (its deepest node on the accepted path,
plus the bonus), c: the chain's leading tokens that the reply then really continued with, read
from the committed tokens once they are known (whether or not the chain was verified), and
extra_cost: the tuner's cost of a step with the chain over one without, minus 1
(`TreeBudget.chain_cost`). The first `FIRST` steps use the chain. Verification is unchanged, so
the output is the same with the chain on or off.
"""

from __future__ import annotations

import statistics
from collections import deque

import torch

from eagle.decoding.prompt_lookup import matched_length

WINDOW = 16  # resolved steps the decision looks back over
FIRST = 4  # steps decoded with the chain before the first decision


class LookupGate:
    """Per generation: `use(m, chain, tokens, parents)` before a step says whether to merge the chain,
    `record(ids, new)` after it learns from the step."""

    def __init__(self, extra_cost: float):
        self.extra_cost = extra_cost
        self.on = True
        self.steps_with_chain = 0
        self.seen: deque[tuple[int, int]] = deque(maxlen=WINDOW)  # (a, c) of resolved steps
        self.pending: deque[tuple[int, torch.Tensor, int]] = deque()  # (m, chain, a) whose c is not known yet
        self.current: tuple[int, torch.Tensor, list[int], list[int]] | None = None

    def use(self, m: int, chain: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor) -> bool:
        """This step's chain [k] (found in the first m committed tokens) and the head's tree (tokens [N],
        parents [N], root first): True to merge the chain."""
        self.current = (m, chain, tokens.tolist(), parents.tolist())
        merge = self.on and chain.numel() > 0
        self.steps_with_chain += merge
        return merge

    def record(self, ids: torch.Tensor, new: torch.Tensor) -> None:
        """After the step: ids [L] all committed tokens, new [n] the ones it added."""
        m, chain, tokens, parents = self.current
        self.pending.append((m, chain, min(new.numel(), 1 + _depth_walked(tokens, parents, new.tolist()))))
        ids = ids.cpu()
        while self.pending:
            m, chain, a = self.pending[0]
            known = ids[m: m + chain.numel()]
            c = matched_length(chain, known)
            if c == known.numel() < chain.numel():
                break  # matching so far: the tokens that tell how far are not decoded yet
            self.seen.append((a, c))
            self.pending.popleft()
        self.on = len(self.seen) < FIRST or self._pays()

    def _pays(self) -> bool:
        tau = statistics.fmean(a for a, _ in self.seen)
        gain = statistics.fmean(max(a, 1 + c) - a for a, c in self.seen)
        return gain > self.extra_cost * tau


def _depth_walked(tokens: list[int], parents: list[int], new: list[int]) -> int:
    """How many of the tokens `new` the tree (tokens, parents; root = node 0) holds as one path below its root."""
    children: dict[tuple[int, int], int] = {(p, t): i for i, (t, p) in enumerate(zip(tokens, parents)) if p >= 0}
    node, depth = 0, 0
    for t in new:
        node = children.get((node, t), -1)
        if node < 0:
            return depth
        depth += 1
    return depth
