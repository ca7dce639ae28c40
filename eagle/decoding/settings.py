"""How the decoder drafts: one settings object, one set of defaults, one command-line binding.

`TreeSettings` is to `EaModel` what `GenerationConfig` is to HF `generate`: the tree's kind,
size and shape, the draft vocabulary and the prompt-lookup branch. `EaModel.from_pretrained`
takes its fields as keyword arguments; `python -m eagle.chat` and the evaluation tools
(bench, profile, tuner_spread) bind them to the same flags with `add_arguments` / `from_arguments`.

The default is the fastest lossless choice measured here: `total_token="auto"`, resolved
when a model is built (`EaModel.from_pretrained` / `EaModel.from_modules` time this device
once, eagle/tuning/tuner.py, and reuse the pick on later loads, eagle/tuning/budget_cache.py),
with a prompt-lookup chain of up to 10 tokens (`lookup=10`; `lookup=0` turns it off): the tuner
measures what a chain of each length adds and costs on its calibration prompts and picks the
length with the tree, 0 and plain decoding included; a tree picked without a chain gets one only
where its row scores at least as well as the tree alone. With a fixed `total_token`, the
chain is `lookup` tokens. A step without a match verifies the tree alone.
An `EaModel` itself always holds numbers.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

from eagle.decoding.tree import DEFAULT_CHOICES, Choices

AUTO = "auto"
TREE_KINDS = ("dynamic", "static")


@dataclass(frozen=True)
class TreeSettings:
    """The draft tree of one EaModel (sampling settings are per call, `eagenerate`'s arguments)."""

    tree: str | Choices = "dynamic"  # dynamic (EAGLE-2) | static (EAGLE-1, DEFAULT_CHOICES) | a choice list
    total_token: int | str = AUTO  # nodes of the dynamic tree, root included; "auto": timed on this device
    depth: int = 5  # draft steps of the dynamic tree
    top_k: int = 8  # children of each expanded node (dynamic tree)
    draft_vocab: int | None = None  # propose only the N most frequent tokens of the head's vocabulary
    lookup: int = 10  # tokens of a prompt-lookup chain merged into each tree (0 = off); "auto": the most it may use

    def __post_init__(self) -> None:
        if self.total_token != AUTO and (not isinstance(self.total_token, int) or self.total_token < 1):
            raise ValueError(f"total_token={self.total_token!r}: expected a positive int or 'auto'")
        if not isinstance(self.tree, list) and self.tree not in TREE_KINDS:
            raise ValueError(f"tree={self.tree!r}: expected one of {TREE_KINDS} or a list of choices")
        for name in ("depth", "top_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: expected >= 1")
        if self.lookup < 0 or (self.draft_vocab is not None and self.draft_vocab < 1):
            raise ValueError(f"lookup={self.lookup}, draft_vocab={self.draft_vocab}: expected lookup >= 0, draft_vocab >= 1")

    @property
    def auto(self) -> bool:
        """True while the dynamic tree's budget is still to be timed on this device."""
        return self.total_token == AUTO and self.choices is None

    @property
    def choices(self) -> Choices | None:
        """The static tree's choice list, or None for the dynamic tree."""
        if self.tree == "dynamic":
            return None
        return DEFAULT_CHOICES if self.tree == "static" else self.tree

    def tuned(self, total_token: int, depth: int, lookup: int | None = None) -> "TreeSettings":
        """The same settings with the dynamic tree's budget (and the chain's length, when given) fixed."""
        return replace(self, total_token=total_token, depth=depth, lookup=self.lookup if lookup is None else lookup)

    def describe(self) -> str:
        """One line for logs and reports."""
        kind = "dynamic" if self.choices is None else f"static ({len(self.choices) + 1} nodes)"
        return (f"{kind} tree, {self.total_token} nodes, depth {self.depth}, top-k {self.top_k}, "
                f"draft vocabulary {self.draft_vocab or 'full'}, lookup {self.lookup or 'off'}")


def parse_total_token(text: str) -> int | str:
    """`auto` or a positive int, for argparse."""
    if text == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive int or 'auto', got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser, **defaults) -> None:
    """The tree flags (--tree, --total-token, --depth, --draft-top-k, --draft-vocab, --lookup), with
    TreeSettings' defaults unless a tool passes its own (e.g. total_token="auto")."""
    d = {**TreeSettings().__dict__, **defaults}
    g = parser.add_argument_group("draft tree (eagle.decoding.settings.TreeSettings)")
    g.add_argument("--tree", default=d["tree"], choices=list(TREE_KINDS), help="dynamic (EAGLE-2) or static (EAGLE-1)")
    g.add_argument("--total-token", type=parse_total_token, default=d["total_token"],
                   help="nodes of the dynamic tree, or 'auto' (timed on this device at load)")
    g.add_argument("--depth", type=int, default=d["depth"], help="draft steps of the dynamic tree")
    g.add_argument("--draft-top-k", type=int, default=d["top_k"], help="children of each expanded draft node")
    g.add_argument("--draft-vocab", type=int, default=d["draft_vocab"],
                   help="propose only the N most frequent tokens of the head's vocabulary "
                        "(EAGLE-1/2: beyond it, the target's other tokens; the target's vocabulary size: all)")
    g.add_argument("--lookup", type=int, default=d["lookup"],
                   help="a prompt-lookup chain of N tokens merged into each tree; with --total-token auto, "
                        "at most N, its length tuned with the tree (0 = off)")


def from_arguments(args: argparse.Namespace) -> TreeSettings:
    """The TreeSettings of parsed `add_arguments` flags."""
    return TreeSettings(tree=args.tree, total_token=args.total_token, depth=args.depth, top_k=args.draft_top_k,
                        draft_vocab=args.draft_vocab, lookup=args.lookup)
