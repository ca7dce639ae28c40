"""Replace assistant turns with the target's own replies (`data.regenerate=true`).

A draft head learns the target's distribution best from text the target wrote. Each
conversation keeps its user turns; turn by turn, the target answers the preceding turns
(its own earlier answers included) through the reply engine of `data.regen.engine` (vLLM, an
OpenAI-compatible server, or our batched decoding: data_prep/reply_engines.py). Up to
`data.regen.concurrency` conversations are in flight, and each sends its next turn as soon as
its last is answered, so the engine never waits for a turn's slowest reply. Results are saved as JSONL
chunks next to the store (`regenerated/chunk-NNNNN.jsonl`, written whole then renamed), so
an interrupted run resumes by chunk, and several ranks split the chunks; at its start a rank
removes the temporary chunk files a killed run left for its chunks (data_prep/stale_files.py).
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

from data_prep.conversations import Conversation
from data_prep.data_config import PrepConfig, RegenConfig
from data_prep.reply_engines import open_engine
from data_prep.reply_requests import ReplyEngine, Request, generate
from data_prep.stale_files import remove_stale
from data_prep.store import tmp_path
from eagle.common import distributed

log = logging.getLogger("data_prep")
CHUNK_SEEDS = 1_000_003  # seeds per chunk: chunk k's requests sample from seed (s + k) * CHUNK_SEEDS onward


def regenerate(prep: PrepConfig, target_dir: Path, tokenizer, conversations: list[Conversation], out: Path,
               rank: int = 0, world: int = 1) -> list[Conversation]:
    """Conversations with regenerated assistant turns, in input order: chunks of data.shard_records,
    sampled with the settings of data.regen, chunk k's from seed (data.seed + k) * CHUNK_SEEDS on."""
    out.mkdir(parents=True, exist_ok=True)
    size = prep.data.shard_records
    n_chunks = -(-len(conversations) // size)
    remove_stale(out, {_chunk_path(out, k).name for k in range(rank, n_chunks, world)})  # what a killed rank left
    todo = [k for k in range(rank, n_chunks, world) if not _chunk_path(out, k).exists()]
    if todo:
        engine = open_engine(prep.data.regen, target_dir, prep.model.dtype, tokenizer, prep.model.max_len)
        generator = ReplyGenerator(engine, tokenizer, prep.data.regen, prep.model.max_len)
        try:
            chunks = {k: conversations[k * size:(k + 1) * size] for k in todo}
            for k, chunk in generator.chunks(chunks, {k: (prep.seed + k) * CHUNK_SEEDS for k in todo}):
                _write_chunk(_chunk_path(out, k), chunk)
                log.info("regenerated chunk %d: %d reply tokens so far (%s)", k, generator.tokens, engine.name)
            log.info("regenerated %d reply tokens at %.1f tokens/s (%s)", generator.tokens, generator.tokens_per_s,
                     engine.name)  # counted as replies end: only the total is exact while others stream
        finally:
            engine.close()
    distributed.barrier()
    return [c for k in range(n_chunks) for c in _read_chunk(_chunk_path(out, k))]


class ReplyGenerator:
    """Replies of the target through `engine` (data_prep/reply_engines.py): whole conversations turn by turn
    (`chunks`), or one reply per prompt (`replies`), whose seeds start at `seed` and advance by the prompts sent."""

    def __init__(self, engine: ReplyEngine, tokenizer, regen: RegenConfig, max_len: int, seed: int = 0):
        self.engine, self.tokenizer, self.regen, self.max_len, self.seed = engine, tokenizer, regen, max_len, seed

    @property
    def tokens(self) -> int:
        return self.engine.tokens

    @property
    def tokens_per_s(self) -> float:
        return self.engine.tokens / self.engine.seconds if self.engine.seconds else 0.0

    def chunks(self, chunks: dict[int, list[Conversation]], seeds: dict[int, int]
               ) -> Iterator[tuple[int, list[Conversation]]]:
        """Every assistant turn of the chunks (up to regen.max_turns per conversation) answered anew; each chunk
        is yielded, in input order without the conversations left with no reply, once all of its conversations
        are done. Up to regen.concurrency conversations are in flight, taken chunk by chunk, the most turns first
        (`Conversations.keys`), and a conversation's next turn goes to the engine as soon as its last is
        answered: the engine's batch stays full across turns and chunks. Turn t of conversation i of chunk k
        samples with seeds[k] + i * max_turns + t, whatever the engine's order."""
        talks = Conversations(chunks, int(self.regen.max_turns))
        waiting = deque(talks.keys())
        bar = tqdm(total=talks.turns, unit="turn", desc=f"regenerate ({self.engine.name})", dynamic_ncols=True,
                   leave=False)
        in_flight = 0
        while waiting or in_flight:
            ready = []  # conversations with a turn to send
            while waiting and in_flight + len(ready) < int(self.regen.concurrency):
                ready.append(waiting.popleft())
            if in_flight:
                for key, text in self.engine.finished():
                    talks.answer(key, text)
                    ready.append(key)
                    in_flight -= 1
                    bar.update(1)
            requests = []
            for key in ready:
                request = self._next_turn(talks, key, seeds[key[0]])
                if request is not None:
                    requests.append(request)
                    continue
                bar.update(talks.unanswered(key))  # ended, or too long to continue
                if talks.end(key):
                    yield key[0], talks.pop_chunk(key[0])
            self.engine.submit(requests, self.regen)
            in_flight += len(requests)
        bar.close()

    def _next_turn(self, talks: Conversations, key: tuple[int, int], seed: int) -> Request | None:
        """The request of conversation `key`'s next user turn, or None when it has no more or its rendering
        would not fit in max_len."""
        messages, turn = talks.next_prompt(key)
        if messages is None:
            return None
        ids = self._encode(messages)
        return None if ids is None else Request(key, ids, seed + key[1] * int(self.regen.max_turns) + turn)

    def _encode(self, messages: list[dict]) -> list[int] | None:
        """The token ids that prompt a reply to `messages`, or None when they leave no room for one."""
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        return list(ids) if len(ids) + 16 <= self.max_len else None

    def replies(self, prompts: dict[int, list[dict]], bar: tqdm | None = None) -> dict[int, str]:
        """One reply per prompt whose rendering fits in max_len. `bar` counts the prompts as they are
        answered."""
        encoded = {i: ids for i, messages in prompts.items() if (ids := self._encode(messages)) is not None}
        out = self.decode_by_length(encoded, bar)
        if bar is not None:
            bar.update(len(prompts) - len(encoded))  # too long to answer
        return out

    def decode_by_length(self, encoded: dict[int, list[int]], bar: tqdm | None = None) -> dict[int, str]:
        """One reply per token-id prompt, sent shortest first (a batched engine then batches similar lengths)."""
        order = sorted(encoded, key=lambda i: len(encoded[i]))
        self.engine.submit([Request(i, encoded[i], self.seed + n) for n, i in enumerate(order)], self.regen)
        self.seed += len(order)
        out: dict[int, str] = {}
        while len(out) < len(order):
            done = self.engine.finished()
            out.update(done)
            if bar is not None:
                bar.update(len(done))
        return out

    def decode_batch(self, prompts: list[list[int]]) -> list[str]:
        """One reply per token-id prompt, in order."""
        texts = generate(self.engine, prompts, self.seed, self.regen)
        self.seed += len(prompts)
        return texts


class Conversations:
    """The chunks' conversations being answered, keyed (chunk, index in chunk): their user turns (up to
    `max_turns`) and the messages answered so far, from the system message on."""

    def __init__(self, chunks: dict[int, list[Conversation]], max_turns: int):
        self.chunks = chunks
        self.users = {(k, i): [m for m in c.messages if m["role"] == "user"][:max_turns]
                      for k, chunk in chunks.items() for i, c in enumerate(chunk)}
        self.done = {(k, i): [m for m in c.messages[:1] if m["role"] == "system"]
                     for k, chunk in chunks.items() for i, c in enumerate(chunk)}
        self.left = {k: len(chunk) for k, chunk in chunks.items()}  # conversations not yet ended
        self.turns = sum(len(u) for u in self.users.values())

    def keys(self) -> list[tuple[int, int]]:
        """Chunk by chunk, the conversations with the most turns first, then the longest original replies: the
        sequential work starts early, and the last conversations to start are short, so the engine's batch does
        not drain into a tail of a few long conversations (a chunk is written once all of its are done)."""
        def work(key: tuple[int, int]) -> tuple[int, int, int]:
            k, i = key
            replies = [m for m in self.chunks[k][i].messages if m["role"] == "assistant"][:len(self.users[key])]
            return k, -len(self.users[key]), -sum(len(str(m["content"])) for m in replies)
        return sorted(self.users, key=work)

    def answered(self, key: tuple[int, int]) -> int:
        return sum(m["role"] == "assistant" for m in self.done[key])

    def unanswered(self, key: tuple[int, int]) -> int:
        return len(self.users[key]) - self.answered(key)

    def next_prompt(self, key: tuple[int, int]) -> tuple[list[dict] | None, int]:
        """The messages a reply to the next user turn continues, and that turn's number (None: no turn left)."""
        turn = self.answered(key)
        return (self.done[key] + [self.users[key][turn]] if turn < len(self.users[key]) else None), turn

    def answer(self, key: tuple[int, int], text: str) -> None:
        self.done[key] += [self.users[key][self.answered(key)], {"role": "assistant", "content": text}]

    def end(self, key: tuple[int, int]) -> bool:
        """Conversation `key` is done; whether its whole chunk is."""
        self.left[key[0]] -= 1
        return self.left[key[0]] == 0

    def pop_chunk(self, k: int) -> list[Conversation]:
        """Chunk k as answered, without the conversations that got no reply (their first turn was too long)."""
        out = []
        for i, c in enumerate(self.chunks.pop(k)):
            done = self.done.pop((k, i))
            del self.users[(k, i)]
            if any(m["role"] == "assistant" for m in done):
                out.append(Conversation(c.index, c.id, done))
        return out


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
