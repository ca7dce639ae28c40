"""Replace assistant turns with the target's own replies (`data.regenerate=true`).

A draft head learns the target's distribution best from text the target wrote. Each
conversation keeps its user turns; turn by turn, the target answers the preceding turns
(its own earlier answers included) in batched generation. Results are saved as JSONL
chunks next to the store (`regenerated/chunk-NNNNN.jsonl`, written whole then renamed), so
an interrupted run resumes by chunk, and several ranks split the chunks; at its start a rank
removes the temporary chunk files a killed run left for its chunks (data_prep/stale_files.py).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import DynamicCache

from eagle.common import distributed
from data_prep.conversations import Conversation
from data_prep.data_config import PrepConfig, RegenConfig
from data_prep.stale_files import remove_stale
from data_prep.store import tmp_path
from eagle.targets.resolve import load_target
from eagle.targets.tokenizer import eos_token_ids
from eagle.decoding.verify import SamplingParams, sample

log = logging.getLogger("data_prep")


def regenerate(prep: PrepConfig, target_dir: Path, tokenizer, conversations: list[Conversation], out: Path,
               rank: int = 0, world: int = 1) -> list[Conversation]:
    """Conversations with regenerated assistant turns, in input order: chunks of data.shard_records,
    chunk k sampled from seed + k with the settings of data.regen."""
    out.mkdir(parents=True, exist_ok=True)
    size = prep.data.shard_records
    n_chunks = -(-len(conversations) // size)
    remove_stale(out, {_chunk_path(out, k).name for k in range(rank, n_chunks, world)})  # what a killed rank left
    todo = [k for k in range(rank, n_chunks, world) if not _chunk_path(out, k).exists()]
    if todo:
        model = load_target(target_dir, prep.model.dtype)
        generator = ReplyGenerator(model, tokenizer, prep.data.regen, prep.model.max_len)
        for k in todo:
            torch.manual_seed(prep.seed + k)
            chunk = generator.conversations(conversations[k * size:(k + 1) * size])
            _write_chunk(_chunk_path(out, k), chunk)
        log.info("regeneration: %d tokens at %.1f tokens/s", generator.tokens, generator.tokens_per_s)
    distributed.barrier()
    return [c for k in range(n_chunks) for c in _read_chunk(_chunk_path(out, k))]


class ReplyGenerator:
    """Batched, length-sorted generation of one turn at a time for many conversations."""

    def __init__(self, model, tokenizer, regen: RegenConfig, max_len: int):
        self.model, self.tokenizer, self.regen, self.max_len = model, tokenizer, regen, max_len
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.tokens, self.seconds = 0, 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def conversations(self, chunk: list[Conversation]) -> list[Conversation]:
        """Regenerate every assistant turn of `chunk` (up to regen.max_turns per conversation)."""
        users = [[m for m in c.messages if m["role"] == "user"][: self.regen.max_turns] for c in chunk]
        system = [[m for m in c.messages[:1] if m["role"] == "system"] for c in chunk]
        done = [list(s) for s in system]
        active = list(range(len(chunk)))
        bar = tqdm(total=sum(len(u) for u in users), unit="turn", desc="regenerate", dynamic_ncols=True, leave=False)
        for turn in range(max((len(u) for u in users), default=0)):
            active = [i for i in active if turn < len(users[i])]
            prompts = {i: done[i] + [users[i][turn]] for i in active}
            replies = self.replies(prompts, bar)
            active = [i for i in active if i in replies]  # too long to continue: stop that conversation
            for i in active:
                done[i] += [users[i][turn], {"role": "assistant", "content": replies[i]}]
        bar.close()
        return [Conversation(c.index, c.id, d) for c, d in zip(chunk, done) if any(m["role"] == "assistant" for m in d)]

    def replies(self, prompts: dict[int, list[dict]], bar: tqdm | None = None) -> dict[int, str]:
        """One reply per prompt whose rendering fits in max_len; batched by length. `bar` counts
        the prompts as their batches finish, with the reply tokens/s so far."""
        encoded = {}
        for i, messages in prompts.items():
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
            if len(ids) + 16 <= self.max_len:
                encoded[i] = list(ids)
        out = self.decode_by_length(encoded, bar)
        if bar is not None:
            bar.update(len(prompts) - len(encoded))  # too long to answer
        return out

    def decode_by_length(self, encoded: dict[int, list[int]], bar: tqdm | None = None) -> dict[int, str]:
        """One reply per token-id prompt, in batches of prompts of similar length (shortest first)."""
        order = sorted(encoded, key=lambda i: len(encoded[i]))
        out = {}
        for b in range(0, len(order), self.regen.batch_size):
            batch = order[b:b + self.regen.batch_size]
            for i, text in zip(batch, self.decode_batch([encoded[i] for i in batch])):
                out[i] = text
            if bar is not None:
                bar.update(len(batch))
                bar.set_postfix(tok_s=f"{self.tokens_per_s:.0f}")
        return out

    @torch.inference_mode()
    def decode_batch(self, prompts: list[list[int]]) -> list[str]:
        """One reply per prompt, decoded as a left-padded batch. A row leaves the batch (and its
        KV cache) as soon as it ends, so each step only runs the rows still writing: about half
        the replies end well before max_new_tokens, and a static batch would keep computing them."""
        ids, attn = left_pad(prompts, self.pad_id)  # [B, W]
        width = ids.shape[1]
        device = self.model.device
        ids, attn = ids.to(device), attn.to(device)  # [B, W]
        positions = (attn.cumsum(-1) - 1).clamp(min=0)  # [B, W]; pads are masked, their position is moot
        params = SamplingParams(float(self.regen.temperature), float(self.regen.top_p))
        cache = DynamicCache(config=self.model.config)
        rows = list(range(len(prompts)))  # prompt index of each live batch row
        replies: list[list[int]] = [[] for _ in prompts]
        start = time.perf_counter()
        for _ in range(min(int(self.regen.max_new_tokens), self.max_len - width)):
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


def left_pad(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [B, W] right-aligned to the longest prompt, and their attention mask [B, W]."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p)
        attn[row, width - len(p):] = 1
    return ids, attn


def _chunk_path(out: Path, k: int) -> Path:
    return out / f"chunk-{k:05d}.jsonl"


def _write_chunk(path: Path, chunk: list[Conversation]) -> None:
    tmp = tmp_path(path)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for c in chunk:
                f.write(json.dumps({"id": c.id, "index": c.index, "messages": c.messages}, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _read_chunk(path: Path) -> list[Conversation]:
    with open(path, encoding="utf-8") as f:
        return [Conversation(r["index"], r["id"], r["messages"]) for r in map(json.loads, f)]
