"""A prompt's eager forward keeps its last row's logits without copying the lm_head (eagle/decoding/eager_target.py)."""

from __future__ import annotations

import torch
from torch.profiler import profile
from transformers import DynamicCache

from eagle.decoding.eager_target import prompt_forward
from tests.tiny import prompt, tiny_llama


def _copied_elements(target, ids: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """The forward's last-row logits [V] and the sizes of the tensors its `aten::copy_` calls wrote."""
    with torch.inference_mode(), profile(record_shapes=True) as prof:
        out = prompt_forward(target, ids, DynamicCache(config=target.config), hidden=True)
    sizes = [int(torch.Size(e.input_shapes[0]).numel()) for e in prof.events() if e.name == "aten::copy_"]
    return out.logits[0, -1], sizes


def test_the_last_rows_logits_equal_the_full_forwards_without_a_copy_of_the_lm_head():
    target = tiny_llama(seed=3, vocab_size=512, hidden_size=64, dtype=torch.bfloat16).requires_grad_(False)
    ids = prompt(5, 40, vocab=512)
    logits, copied = _copied_elements(target, ids)
    with torch.inference_mode():
        full = target(input_ids=ids).logits[0, -1]
    torch.testing.assert_close(logits, full)
    weight = target.lm_head.weight.numel()  # 512 x 64: a bf16 batched product over a [1, 1, H] view copies all of it
    assert weight not in copied, f"the prompt's lm_head copied its weight ({weight} elements): {sorted(copied)[-3:]}"
