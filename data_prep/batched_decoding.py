"""Our own batched reply engine (`data.regen.engine=ours`): the target in this process, one KV-cache slot a reply.

The engine that needs nothing installed besides this project. `data.regen.batch_size` replies are
written at once (fewer if their cache would take more than half the free memory), each in its own slot
of a preallocated cache (data_prep/slot_attention.py), in the model's dtype or, for a bf16 run computing in
fp32 on a CPU without bf16 arithmetic, in bf16 (`kv_dtype`: half the bytes attention reads):

- **One forward a step, prompts and replies together.** A step's rows are tokens: every live reply's
  last token, and up to `prefill_tokens` tokens of the prompts waiting to be read, in chunks, the
  earliest admitted first. Each row attends over its own slot, so the target's weights are read once
  a step for all of them, where a forward per prompt cost ~80 ms for a 30-token follow-up turn.
  Logits are computed only for the rows that end a prompt or extend a reply.
- **Continuous batching.** A reply that ends frees its slot, and a queued request takes it before
  the next step, so the batch stays full while requests wait.
- **A conversation's next turn reuses its slot.** Its prompt starts with the previous turn's prompt
  and reply, whose keys and values are still in the slot where that reply ended: only the tokens
  after the common prefix are read. A request whose key (the conversation) last ended in a free slot
  takes it ahead of the queue; others take the slot freed longest ago, in queue order.
- **A compiled step.** One graph serves every step (`torch.compile` with dynamic shapes; ~50 s at
  its first step on a machine; a later process traces it and reads it from inductor's disk cache in
  ~25 s): it fuses the norms, rotary embeddings and activations between HF's matmuls, ~10 % of a step.

Greedy replies equal the target's greedy decoding of each prompt alone (up to bf16 near-ties); a sampled
reply draws from its own generator, seeded with its request's seed, so it does not depend on the batch.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Hashable

import torch

from data_prep.data_config import RegenConfig
from data_prep.reply_requests import Request
from data_prep.slot_attention import SlotCache, slot_attention, slot_bytes
from eagle.decoding.verify import SamplingParams, greedy_ids, sample
from eagle.targets.tokenizer import eos_token_ids

log = logging.getLogger("data_prep")
PREFILL_TOKENS = 512  # prompt tokens read a step, beside the replies' tokens


@dataclass
class Slot:
    """One slot of the cache: the tokens whose keys and values it holds, and the reply it is writing."""

    ids: list[int] = field(default_factory=list)  # positions 0..len-1 of the slot's cache
    feed: list[int] = field(default_factory=list)  # tokens to read next: the prompt's rest, or the reply's last
    request: Request | None = None  # None: free
    params: SamplingParams | None = None
    generator: torch.Generator | None = None  # sampled replies only
    budget: int = 0  # reply tokens it may write
    reply: list[int] = field(default_factory=list)
    admitted: int = 0  # the admission's number: prompts are read in this order
    freed: int = 0  # the step it was freed at


def free_memory(device: torch.device) -> int:
    """Bytes free on the device: CUDA's free memory, else the system's available memory."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) * 1024


def slot_count(model, wanted: int, max_len: int, kv_dtype: torch.dtype) -> int:
    """`wanted` slots, or as many as half the free memory holds (one at least), said in the log."""
    fits = free_memory(model.device) // 2 // slot_bytes(model.config, max_len, kv_dtype)
    if fits < wanted:
        log.warning("ours: data.regen.batch_size=%d slots of %d positions do not fit in half the free memory; "
                    "decoding %d at once", wanted, max_len, max(1, fits))
    return max(1, min(wanted, fits))


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class BatchedDecoding:
    """Replies to token-id prompts by the target in this process; `tokens` / `seconds` count its work,
    `prefilled` / `reused` the prompt tokens it read and the ones it found in a slot."""

    name = "ours"

    def __init__(self, model, tokenizer, regen: RegenConfig, max_len: int, compile: bool = True,
                 prefill_tokens: int = PREFILL_TOKENS, kv_dtype: torch.dtype | None = None):
        """kv_dtype: the KV cache's (None: the model's); bf16 under an fp32 model is read at half the bytes."""
        self.model, self.tokenizer, self.max_len, self.prefill_tokens = model, tokenizer, max_len, prefill_tokens
        self.eos_ids = eos_token_ids(model, tokenizer)
        kv_dtype = kv_dtype or model.dtype
        self.slots = [Slot() for _ in range(slot_count(model, int(regen.batch_size), max_len, kv_dtype))]
        self.cache = SlotCache(model.config, len(self.slots), max_len, kv_dtype, model.device)
        log.info("ours: %d slots of %d positions, %.1f GB of %s KV cache", len(self.slots), max_len,
                 self.cache.bytes / 1e9, str(kv_dtype).removeprefix("torch."))
        self.compiled = torch.compile(self.forward, fullgraph=True, dynamic=True) if compile else None
        self.compiled_once = False
        self.queue: deque[tuple[Request, RegenConfig]] = deque()
        self.home: dict[Hashable, int] = {}  # request key -> the slot its last reply ended in
        self.done: list[tuple[Hashable, str]] = []
        self.tokens, self.seconds, self.prefilled, self.reused, self.steps, self.admissions = 0, 0.0, 0, 0, 0, 0

    def submit(self, requests: list[Request], settings: RegenConfig) -> None:
        self.queue.extend((r, settings) for r in requests)

    def finished(self) -> list[tuple[Hashable, str]]:
        """Steps until one reply at least has ended; the replies that did."""
        if not self.queue and not self.live():
            raise RuntimeError("finished(): no reply is being written")
        start = time.perf_counter()
        with torch.inference_mode(), slot_attention(self.model):
            while not self.done:
                self.admit()
                self.step()
        self.seconds += time.perf_counter() - start
        out, self.done = self.done, []
        return out

    def live(self) -> list[int]:
        return [i for i, s in enumerate(self.slots) if s.request is not None]

    def admit(self) -> None:
        """Queued requests into free slots. A request whose slot (its conversation's last reply) is free goes
        first, into that slot; the others in queue order, into the free slot left longest ago."""
        while self.queue:
            free = {i for i, s in enumerate(self.slots) if s.request is None}
            if not free:
                return
            back = next((n for n, (r, _) in enumerate(self.queue) if self.home.get(r.key) in free), 0)
            request, settings = self.queue[back]
            del self.queue[back]
            home = self.home.pop(request.key, None)
            self.start(home if home in free else min(free, key=lambda i: self.slots[i].freed), request, settings)

    def start(self, index: int, request: Request, settings: RegenConfig) -> None:
        """A request into slot `index`: what the slot holds of its prompt is kept, the rest is to be read."""
        slot, prompt = self.slots[index], list(request.prompt)
        if len(prompt) >= self.max_len:
            raise ValueError(f"request {request.key!r}: a {len(prompt)}-token prompt leaves no room in max_len={self.max_len}")
        keep = common_prefix(slot.ids, prompt[:-1])  # the last prompt token is read for its logits
        params = SamplingParams(float(settings.temperature), float(settings.top_p))
        slot.request, slot.params, slot.reply, slot.ids, slot.feed = request, params, [], prompt[:keep], prompt[keep:]
        slot.generator = None if params.greedy else torch.Generator(self.model.device).manual_seed(int(request.seed))
        slot.budget = max(1, min(int(settings.max_new_tokens), self.max_len - len(prompt)))
        slot.admitted, self.admissions = self.admissions, self.admissions + 1
        self.reused, self.prefilled = self.reused + keep, self.prefilled + len(prompt) - keep

    def rows(self) -> tuple[list[int], list[int], list[int], list[int]]:
        """This step's rows (token, position, slot) and the slots whose last row this step gets logits:
        every reply's last token, then prompt chunks in admission order up to `prefill_tokens` (one chunk at
        least)."""
        tokens, positions, slots, ends = [], [], [], []
        budget = self.prefill_tokens
        for index in sorted(self.live(), key=lambda i: (len(self.slots[i].feed) > 1, self.slots[i].admitted)):
            slot = self.slots[index]
            n = len(slot.feed) if len(slot.feed) == 1 else min(len(slot.feed), budget)
            if n <= 0:
                continue
            if len(slot.feed) > 1:
                budget -= n
            tokens += slot.feed[:n]
            positions += range(len(slot.ids), len(slot.ids) + n)
            slots += [index] * n
            slot.ids += slot.feed[:n]  # in place: a slot's ids grow by a token a step
            del slot.feed[:n]
            if not slot.feed:
                ends.append(index)
        return tokens, positions, slots, ends

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Logits [K, V] of rows `keep` [K] of one step: ids and positions [1, N], each row in its slot of `slots` [N]."""
        return self.model(input_ids=ids, position_ids=positions, use_cache=False, logits_to_keep=keep,
                          eagle_slots=self.cache.rows(slots, positions[0])).logits[0]

    def step(self) -> None:
        """One forward over this step's rows; a token drawn for every slot whose prompt or last token was read."""
        tokens, positions, slots, ends = self.rows()
        last = {index: row for row, index in enumerate(slots)}  # each slot's last row
        keep = [last[index] for index in ends]
        if len(tokens) < 2:  # the compiled graph's sizes are dynamic from 2 on: a repeated row rewrites its own key
            tokens, positions, slots = tokens * 2, positions * 2, slots * 2
        keep_rows = keep + [0] * max(0, 2 - len(keep))  # likewise, logits of row 0 dropped
        forward = self.compiled if self.compiled is not None else self.forward
        if self.compiled is not None and not self.compiled_once:
            log.info("ours: compiling the step (once a machine; inductor caches it on disk)")
            self.compiled_once = True
        device = self.model.device
        logits = forward(torch.tensor([tokens], device=device), torch.tensor([positions], device=device),
                         torch.tensor(slots, device=device), torch.tensor(keep_rows, device=device))[:len(keep)]  # [K, V]
        drawn = greedy_ids(logits).tolist()  # [K]
        for j, index in enumerate(ends):
            slot = self.slots[index]
            if not slot.params.greedy:
                drawn[j] = int(sample(logits[j], slot.params, slot.generator))
        self.steps += 1
        for index, token in zip(ends, drawn):
            self.take(index, token)

    def take(self, index: int, token: int) -> None:
        """The token a slot's reply drew: written, or the reply's end (an end token, its budget, the cache)."""
        slot = self.slots[index]
        if token not in self.eos_ids:
            slot.reply.append(token)
            slot.feed = [token]
        if token in self.eos_ids or len(slot.reply) >= slot.budget or len(slot.ids) >= self.max_len:
            self.finish(index)

    def finish(self, index: int) -> None:
        slot = self.slots[index]
        self.done.append((slot.request.key, self.tokenizer.decode(slot.reply, skip_special_tokens=True).strip()))
        self.tokens += len(slot.reply)
        self.home[slot.request.key] = index
        slot.request, slot.generator, slot.feed, slot.freed = None, None, [], self.steps

    def close(self) -> None:
        if self.prefilled + self.reused:
            log.info("ours: %d reply tokens in %d steps; prompt tokens read %d, reused from slots %d",
                     self.tokens, self.steps, self.prefilled, self.reused)
