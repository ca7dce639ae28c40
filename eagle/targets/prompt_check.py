"""One-line errors for prompts a target cannot take, checked before any forward."""

from __future__ import annotations

import torch
from torch import nn


def check_prompt(target: nn.Module, input_ids: torch.Tensor, max_new_tokens: int) -> None:
    """Raise ValueError for a batch other than 1, an empty prompt, ids outside the vocabulary, a prompt
    longer than the target's positions, or a negative max_new_tokens. input_ids [1, S]"""
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"batch size 1 only: input_ids must be [1, S], got {tuple(input_ids.shape)}")
    s, vocab = input_ids.shape[1], target.get_input_embeddings().weight.shape[0]
    limit = getattr(target.config.get_text_config(), "max_position_embeddings", None)
    if s == 0:
        raise ValueError("input_ids is empty: a prompt needs at least one token (e.g. the BOS token)")
    if int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab:
        raise ValueError(f"input_ids hold ids outside the target's vocabulary [0, {vocab}): "
                         f"min {int(input_ids.min())}, max {int(input_ids.max())}")
    if limit and s >= limit:
        raise ValueError(f"the prompt has {s} tokens; the target takes at most {limit} positions")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens}: use a number >= 0")
