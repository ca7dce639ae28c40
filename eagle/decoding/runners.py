"""The two interfaces `EaModel` decodes through: one for the target's forwards, one for the head's.

Each has an eager implementation (eagle/decoding/eager_target.py, eagle/decoding/eager_head.py)
and a compiled one at fixed shapes (eagle/compiled/target_graphs.py `CompiledTarget`,
eagle/compiled/head_graphs.py `CompiledHead`). The decoder picks one of each when it is built;
after that no step asks which kind it holds.

    out, cache = runner.prefill(input_ids, room, reused)             # the prompt [1, S]: hidden states, last logits
    out = runner.tree_forward(cache, tokens, positions, tree, past)   # a tree of N nodes
    runner.keep_rows(cache, past, path)                              # keep nodes `path` [n] (empty: none)
    logits, cache = runner.plain_prefill(input_ids, reused)          # plain decoding: logits [V]
    logits = runner.plain_step(cache, token, past)                   # one token [1] -> logits [V]
    rows = runner.rows(cache, n)                                     # its first n rows, for a later prompt

`cache` is what `DecodeState.target_cache` holds: eager, the generation's `DynamicCache`; compiled,
the runner itself (its bucketed static cache, one generation at a time). `out` is HF's model
output; the compiled runner pads a one-node tree to 2 rows. `reused` (None, or the first Q rows of an
earlier generation's cache, eagle/decoding/prefix_cache.py) starts a prompt's cache: its forward runs the
other S - Q tokens.

    past = head.start(kv)                                            # a prompt's head cache, eager
    hidden, logp, past = head.encode(embeds, features, positions, allowed, past, scored)
                                          # logp: draft log-probs [scored, Vd] of the last rows, CPU
    kv = head.rows(past, n)                                          # its first n rows, for a later prompt

`past` is what `DecodeState.head_past` holds: eager, the head's (keys, values); compiled, `HeadRows`.

No implementation imports this file: the protocols are structural (and runtime-checkable, for tests).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from eagle.decoding.tree import Tree


@runtime_checkable
class TargetRunner(Protocol):
    """The target's forwards for one generation at a time, over the cache its `prefill` returns."""

    def prefill(self, input_ids: torch.Tensor, room: int, reused: list | None = None) -> tuple[Any, Any]:
        """The prompt [1, S] with hidden states into a new cache with `room` more rows, its first Q rows `reused`'s;
        (HF output over the other S - Q, cache). The output holds the last row's logits only where the target takes
        `logits_to_keep` (eager_target.prompt_forward)."""

    def tree_forward(self, cache: Any, tokens: torch.Tensor, positions: torch.Tensor, tree: Tree,
                     past: int) -> Any:
        """The tree's tokens [N] at positions [N] after `past` committed rows, each attending to the
        committed rows and its ancestors; appends N rows (compiled: at least 2). HF output."""

    def keep_rows(self, cache: Any, past: int, path: torch.Tensor) -> None:
        """Keep the tree rows of nodes `path` [n] (root first) after `past` committed rows, in place."""

    def plain_prefill(self, input_ids: torch.Tensor, reused: list | None = None) -> tuple[torch.Tensor, Any]:
        """Plain decoding's prompt [1, S], its first Q rows `reused`'s: (its last logits [V], a new cache)."""

    def plain_step(self, cache: Any, token: torch.Tensor, past: int) -> torch.Tensor:
        """One token [1] at position `past` (the rows in the cache); its logits [V]."""

    def rows(self, cache: Any, n: int) -> list | None:
        """The first n rows of every layer ((keys, values) [1, kvH, n, D] each) as no later forward changes them;
        None where a layer keeps only a window."""


@runtime_checkable
class HeadRunner(Protocol):
    """The draft head's forward, with its scorer, over the head cache a decode state holds."""

    def start(self, past: tuple[torch.Tensor, torch.Tensor]) -> Any:
        """A prompt's head cache ((keys, values) [1, C, S, D], from the eager prefill) as a state's `head_past`."""

    def rows(self, past: Any, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first n rows of a state's head cache ([1, C, n, D] each) as no later call changes them."""

    def encode(self, embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
               allowed: torch.Tensor | None, past: Any,
               scored: int = 0) -> tuple[torch.Tensor, torch.Tensor | None, Any]:
        """Head rows (token embeddings [m, H], features [m, F]) at positions [m] after `past`'s P rows;
        allowed [m, P+m] bool (CPU, None: causal). Outputs [m, H], the draft log-probs [scored, Vd]
        (fp32, CPU) of the last `scored` rows (0: None; the compiled runner scores in the head's graph)
        and the cache with the m rows (the rows of `past` itself are not modified)."""
