"""What every reply engine (data_prep/reply_engines.py) takes and gives: requests in, keyed replies out.

    engine.submit([Request(key, prompt_ids, seed), ...], settings)   # returns at once
    for key, text in engine.finished(): ...                          # waits for one reply at least
    texts = generate(engine, prompts, seed, settings)                # a batch, in order
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Protocol

from data_prep.data_config import RegenConfig


@dataclass(frozen=True)
class Request:
    """One reply to write: `key` names it to the caller, `seed` samples it."""

    key: Hashable
    prompt: list[int]  # token ids, chat template applied
    seed: int


class ReplyEngine(Protocol):
    name: str
    tokens: int  # reply tokens written so far
    seconds: float  # seconds spent writing them

    def submit(self, requests: list[Request], settings: RegenConfig) -> None:
        """Start writing a reply to each request, sampled as `settings` say (temperature, top_p,
        max_new_tokens); returns at once, and a caller may submit more before the last are answered."""

    def finished(self) -> list[tuple[Hashable, str]]:
        """(key, stripped reply text) of submitted requests answered since the last call; waits for one at least."""

    def close(self) -> None: ...


def generate(engine: ReplyEngine, prompts: list[list[int]], seed: int, settings: RegenConfig) -> list[str]:
    """One reply per token-id prompt, in order; prompt i samples with seed + i."""
    engine.submit([Request(i, p, seed + i) for i, p in enumerate(prompts)], settings)
    texts: dict[Hashable, str] = {}
    while len(texts) < len(prompts):
        texts.update(engine.finished())
    return [texts[i] for i in range(len(prompts))]
