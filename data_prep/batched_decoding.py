"""Our own batched decoding of replies (`data.regen.engine=ours`), with the target loaded in this process.

The engine that needs nothing installed besides this project. Prompts are decoded in
left-padded batches of `data.regen.batch_size` prompts of similar length; a row leaves the
batch (and its KV cache) as soon as it ends, so each step only runs the rows still writing:
about half the replies end well before max_new_tokens, and a static batch would keep
computing them.
"""

from __future__ import annotations

import time
from itertools import groupby
from typing import Hashable

import torch
from transformers import DynamicCache

from data_prep.data_config import RegenConfig
from data_prep.reply_requests import Request
from eagle.decoding.verify import SamplingParams, sample
from eagle.targets.tokenizer import eos_token_ids


class BatchedDecoding:
    """Replies to token-id prompts by the target in this process; `tokens` / `seconds` count its work."""

    name = "ours"

    def __init__(self, model, tokenizer, regen: RegenConfig, max_len: int):
        self.model, self.tokenizer, self.max_len = model, tokenizer, max_len
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.batch_size = int(regen.batch_size)
        self.tokens, self.seconds = 0, 0.0
        self.pending: list[tuple[Request, RegenConfig]] = []

    def submit(self, requests: list[Request], settings: RegenConfig) -> None:
        self.pending += [(r, settings) for r in requests]

    def finished(self) -> list[tuple[Hashable, str]]:
        """Every request submitted since the last call, answered now: shortest prompts first, in batches of
        `batch_size` (of similar lengths), sampled from the first request's seed."""
        pending, self.pending = self.pending, []
        out = []
        for settings, run in groupby(pending, key=lambda p: p[1]):  # the submits' settings in turn
            requests = sorted((r for r, _ in run), key=lambda r: len(r.prompt))
            texts = self.generate([r.prompt for r in requests], requests[0].seed, settings)
            out += [(r.key, text) for r, text in zip(requests, texts)]
        return out

    def generate(self, prompts: list[list[int]], seed: int, settings: RegenConfig) -> list[str]:
        """One reply per prompt, in batches of `batch_size` taken in the given order."""
        torch.manual_seed(seed)
        return [text for b in range(0, len(prompts), self.batch_size)
                for text in self.decode_batch(prompts[b:b + self.batch_size], settings)]

    @torch.inference_mode()
    def decode_batch(self, prompts: list[list[int]], settings: RegenConfig) -> list[str]:
        """One reply per prompt, decoded as one left-padded batch whose ended rows leave it."""
        ids, attn = left_pad(prompts, self.pad_id)  # [B, W]
        width = ids.shape[1]
        device = self.model.device
        ids, attn = ids.to(device), attn.to(device)  # [B, W]
        positions = (attn.cumsum(-1) - 1).clamp(min=0)  # [B, W]; pads are masked, their position is moot
        params = SamplingParams(float(settings.temperature), float(settings.top_p))
        cache = DynamicCache(config=self.model.config)
        rows = list(range(len(prompts)))  # prompt index of each live batch row
        replies: list[list[int]] = [[] for _ in prompts]
        start = time.perf_counter()
        for _ in range(min(int(settings.max_new_tokens), self.max_len - width)):
            logits = self.model(input_ids=ids, attention_mask=attn, position_ids=positions, past_key_values=cache,
                                use_cache=True, logits_to_keep=1).logits[:, -1]  # [b, V]
            tokens = sample(logits, params).tolist()  # [b]
            live = [j for j, t in enumerate(tokens) if t not in self.eos_ids]
            for j in live:
                replies[rows[j]].append(tokens[j])
            if not live:
                break
            if len(live) < len(rows):
                keep = torch.tensor(live, device=device)
                for layer in cache.layers:
                    layer.batch_select_indices(keep)
                rows, attn, positions = [rows[j] for j in live], attn[keep], positions[keep]
            ids = torch.tensor([tokens[j] for j in live], device=device)[:, None]  # [b, 1]
            attn = torch.cat([attn, attn.new_ones(len(rows), 1)], dim=1)
            positions = positions[:, -1:] + 1
        self.seconds += time.perf_counter() - start
        self.tokens += sum(len(r) for r in replies)
        return [self.tokenizer.decode(r, skip_special_tokens=True).strip() for r in replies]

    def close(self) -> None:
        pass


def left_pad(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [B, W] right-aligned to the longest prompt, and their attention mask [B, W]."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p)
        attn[row, width - len(p):] = 1
    return ids, attn
