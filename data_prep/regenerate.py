"""Replace assistant turns with the target's own replies (`data.regenerate=true`).

A draft head learns the target's distribution best from text the target wrote. Each
conversation keeps its user turns; turn by turn, the target answers the preceding turns
(its own earlier answers included), all conversations of a chunk at once through the reply
engine of `data.regen.engine` (vLLM, an OpenAI-compatible server, or our batched decoding:
data_prep/reply_engines.py). Results are saved as JSONL
chunks next to the store (`regenerated/chunk-NNNNN.jsonl`, written whole then renamed), so
an interrupted run resumes by chunk, and several ranks split the chunks; at its start a rank
removes the temporary chunk files a killed run left for its chunks (data_prep/stale_files.py).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from tqdm import tqdm

from data_prep.conversations import Conversation
from data_prep.data_config import PrepConfig, RegenConfig
from data_prep.reply_engines import ReplyEngine, open_engine
from data_prep.stale_files import remove_stale
from data_prep.store import tmp_path
from eagle.common import distributed

log = logging.getLogger("data_prep")
CHUNK_SEEDS = 1_000_003  # seeds per chunk: chunk k's requests sample from seed (s + k) * CHUNK_SEEDS onward


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
        engine = open_engine(prep.data.regen, target_dir, prep.model.dtype, tokenizer, prep.model.max_len)
        generator = ReplyGenerator(engine, tokenizer, prep.data.regen, prep.model.max_len)
        try:
            for k in todo:
                generator.seed = (prep.seed + k) * CHUNK_SEEDS
                chunk = generator.conversations(conversations[k * size:(k + 1) * size])
                _write_chunk(_chunk_path(out, k), chunk)
                log.info("regenerated chunk %d: %d reply tokens so far at %.1f tokens/s (%s)", k, generator.tokens,
                         generator.tokens_per_s, engine.name)
        finally:
            engine.close()
    distributed.barrier()
    return [c for k in range(n_chunks) for c in _read_chunk(_chunk_path(out, k))]


class ReplyGenerator:
    """The turns of many conversations answered one turn at a time, each turn's prompts through `engine`
    (data_prep/reply_engines.py) at once; `seed` advances by the prompts sent, so a chunk's replies
    depend only on the seed it starts from."""

    def __init__(self, engine: ReplyEngine, tokenizer, regen: RegenConfig, max_len: int, seed: int = 0):
        self.engine, self.tokenizer, self.regen, self.max_len, self.seed = engine, tokenizer, regen, max_len, seed

    @property
    def tokens(self) -> int:
        return self.engine.tokens

    @property
    def tokens_per_s(self) -> float:
        return self.engine.tokens / self.engine.seconds if self.engine.seconds else 0.0

    def conversations(self, chunk: list[Conversation]) -> list[Conversation]:
        """Regenerate every assistant turn of `chunk` (up to regen.max_turns per conversation)."""
        users = [[m for m in c.messages if m["role"] == "user"][: self.regen.max_turns] for c in chunk]
        system = [[m for m in c.messages[:1] if m["role"] == "system"] for c in chunk]
        done = [list(s) for s in system]
        active = list(range(len(chunk)))
        bar = tqdm(total=sum(len(u) for u in users), unit="turn", desc=f"regenerate ({self.engine.name})",
                   dynamic_ncols=True, leave=False)
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
        """One reply per prompt whose rendering fits in max_len. `bar` counts the prompts as they are
        answered, with the reply tokens/s so far."""
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
        """One reply per token-id prompt; the engine gets them shortest first, so its batches are of
        similar lengths. A batched engine gets them in groups of regen.batch_size for the progress bar."""
        order = sorted(encoded, key=lambda i: len(encoded[i]))
        group = len(order) if self.engine.name != "ours" else int(self.regen.batch_size)
        out = {}
        for b in range(0, len(order), max(group, 1)):
            part = order[b:b + group]
            out.update(zip(part, self.decode_batch([encoded[i] for i in part])))
            if bar is not None:
                bar.update(len(part))
                bar.set_postfix(tok_s=f"{self.tokens_per_s:.0f}")
        return out

    def decode_batch(self, prompts: list[list[int]]) -> list[str]:
        """One reply per token-id prompt, in order."""
        texts = self.engine.generate(prompts, self.seed, self.regen)
        self.seed += len(prompts)
        return texts


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
