"""Which target layers a draft head reads, and which a feature store holds: one definition.

Indices are `hidden_states` indices as HF returns them: 0 is the embedding output, i the
output of decoder layer i, and `LAST` (-1) the last one *after* the final norm, the input of
`lm_head`.

- An EAGLE-1/2 head reads [LAST], the feature it also predicts.
- An EAGLE-3 head fuses several layers, by default the paper's low, middle and high one of an
  N-layer target, [2, N//2, N-3]. Its config lists those (`feature_layers`), never LAST; an
  empty list means the default for the target it runs on.
- The feature store for an EAGLE-3 head holds its fused layers *plus* LAST, whose `lm_head`
  gives the target distribution of the EAGLE-3 loss: `store_layers(fused)`, and back,
  `fused_layers(stored)`.
"""

from __future__ import annotations

from collections.abc import Iterable

LAST = -1


def default_fused(num_layers: int) -> list[int]:
    """The paper's low, middle and high layer of an N-layer target: [2, N//2, N-3]."""
    if num_layers < 5:
        raise ValueError(f"EAGLE-3 fuses three distinct layers; a {num_layers}-layer target is too shallow")
    return [2, num_layers // 2, num_layers - 3]


def store_layers(fused: Iterable[int]) -> list[int]:
    """What a store for a head fusing `fused` captures: those layers, then LAST."""
    return [int(i) for i in fused if int(i) != LAST] + [LAST]


def fused_layers(stored: Iterable[int]) -> list[int]:
    """The fused layers of a store's (or a config's) list: every index but LAST, in order."""
    return [int(i) for i in stored if int(i) != LAST]


def head_layers(configured: Iterable[int], num_layers: int) -> list[int]:
    """The layers an EAGLE-3 head reads on an N-layer target: its configured ones, or the
    default when it lists none; an index outside the target is a clear error."""
    layers = list(configured) or default_fused(num_layers)
    if any(not -num_layers - 1 <= i <= num_layers for i in layers):
        raise ValueError(f"this EAGLE-3 head reads target layers {layers}, but the target has {num_layers} layers")
    return layers


def target_feature_layers(head, target) -> list[int]:
    """hidden_states indices a head reads from its target: an EAGLE-3 head's (`head_layers`), the last for EAGLE-1/2."""
    if head.config.architecture != "eagle3":
        return [LAST]
    return head_layers(head.config.feature_layers, target.config.get_text_config().num_hidden_layers)
