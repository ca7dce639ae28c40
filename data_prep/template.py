"""Render a conversation with the target's chat template and mask assistant tokens.

The mask must hold for any template, so it is derived from the template itself rather
than from ChatML markers: for each assistant turn i,

    before = render(messages[:i], add_generation_prompt=True)   # ends with the reply header
    after  = render(messages[:i + 1])                           # ends after the reply's end-of-turn

The characters between the two, from where the reply's content starts up to the end-of-turn
marker (trailing whitespace excluded), are the assistant span. Tokens overlapping a span are
masked in (1); role headers, system and user text never are.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass

from data_prep import repeats


class TemplateError(ValueError):
    """The template re-renders earlier turns differently (its output is not prefix-stable)."""


@dataclass
class Tokenized:
    input_ids: list[int]
    loss_mask: list[int]  # 1 = assistant reply token (or its end-of-turn token)


def template_hash(tokenizer) -> str:
    return hashlib.sha256((tokenizer.chat_template or "").encode("utf-8")).hexdigest()


def render(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def assistant_spans(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered text and the character spans [start, end) of assistant replies."""
    full = render(tokenizer, messages)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render(tokenizer, messages[:i], add_generation_prompt=True)
        after = render(tokenizer, messages[: i + 1])
        if not (after.startswith(before) and full.startswith(after)):
            raise TemplateError("the chat template renders earlier turns differently once later turns are added")
        start, end = len(before), len(after)
        content_at = full.find(message["content"].strip(), start, end)
        if content_at >= 0:
            start = content_at
        while end > start and full[end - 1].isspace():
            end -= 1
        spans.append((start, end))
    return full, spans


def tokenize_conversation(tokenizer, messages: list[dict], max_len: int) -> Tokenized:
    """Token ids and assistant-only loss mask, truncated to `max_len` tokens."""
    text, spans = assistant_spans(tokenizer, messages)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"][:max_len], enc["offset_mapping"][:max_len]
    mask, k = [], 0
    for s, e in offsets:
        while k < len(spans) and spans[k][1] <= s:
            k += 1
        inside = k < len(spans) and s < spans[k][1] and e > spans[k][0] and e > s
        mask.append(int(inside))
    return Tokenized(input_ids=list(ids), loss_mask=mask)


def tokenize_chunk(tokenizer, chunk, max_len: int, mask_repeats: int | None = None
                   ) -> tuple[list[tuple[list[int], list[int]]], Counter]:
    """(input_ids, loss_mask) of each usable conversation of `chunk`, in order, and why the others were
    skipped: what data_prep stores and what online training reads (data_prep/tokens.py).
    `mask_repeats`: n, to take the reply tokens that repeat an earlier n-gram out of the loss
    (data_prep/repeats.py); None keeps every reply token."""
    out, skipped = [], Counter()
    for conv in chunk:
        try:
            t = tokenize_conversation(tokenizer, conv.messages, max_len)
        except TemplateError:
            skipped["chat template not prefix-stable"] += 1
            continue
        if not any(t.loss_mask):
            skipped["no assistant tokens within max_len"] += 1
            continue
        mask = t.loss_mask if mask_repeats is None else repeats.mask_repeats(t.input_ids, t.loss_mask, mask_repeats)
        out.append((t.input_ids, mask))
    return out, skipped
