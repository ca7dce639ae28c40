"""Judging a head by real decoding: τ on held-back chat prompts while it trains.

Held-out top-1 says how often the draft's next token is right given the target's *true*
features; τ (new tokens per target forward) is what decoding gains once the head drafts
several tokens on its own predictions. The two can disagree, so the trainer reports both.

    judge = Judge.from_target_dir(target_dir, held_back_prompts("mtbench", 8), max_new_tokens=64)  # data_prep.prompt_sets
    judge.measure_state(state, draft_config).metrics()
    # {"tau_tree": ..., "tau_chain": ..., "tau_seconds": ...}

Two trees: the EAGLE-2 dynamic tree (`tree`) and a plain 5-token chain (`chain`). Decoding is
greedy over a fixed list of prompts, so the same head always gets the same τ. The target is
loaded on first use and kept; no global RNG state changes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from eagle.heads.checkpoint import Head, head_from_state
from eagle.heads.eagle2 import DraftConfig
from eagle.model import EaModel
from eagle.decoding.settings import TreeSettings
from eagle.targets.resolve import load_target
from eagle.targets.tokenizer import chat_prompt, load_tokenizer
from eagle.decoding.tree import Choices, chain_choices

log = logging.getLogger("train")

CHAIN: Choices = chain_choices(5)
# Fixed trees, not the tuned default: a head's τ must not depend on the machine that measures it; and the
# head alone, without the default's prompt-lookup chain.
TREES: dict[str, TreeSettings] = {"tree": TreeSettings(total_token=24, depth=5, top_k=8, lookup=0),
                                  "chain": TreeSettings(tree=CHAIN, lookup=0)}


@dataclass
class TauCount:
    """Tokens and target forwards (after the prefill) summed over prompts."""

    new_tokens: int = 0
    steps: int = 0

    @property
    def tau(self) -> float:
        return self.new_tokens / self.steps if self.steps else float("nan")


@dataclass
class Acceptance:
    """τ of one head under each tree, and the seconds all the decoding took."""

    counts: dict[str, TauCount] = field(default_factory=dict)
    seconds: float = 0.0

    def metrics(self) -> dict[str, float]:
        """{"tau_<tree>": τ, ..., "tau_seconds": s}, the keys the trainer logs."""
        out = {f"tau_{name}": c.tau for name, c in self.counts.items()}
        out["tau_seconds"] = self.seconds
        return out


def encode_prompts(tokenizer, texts: list[str]) -> list[torch.Tensor]:
    """One user turn each, through the chat template with the generation prompt. [1, S_i] each"""
    return [chat_prompt(tokenizer, [{"role": "user", "content": text}]) for text in texts]


# ---- decoding --------------------------------------------------------------------------------


def count_tau(model, prompts: list[torch.Tensor], max_new_tokens: int) -> TauCount:
    """Greedy `eagenerate` over prompts [1, S_i] in order; sums `last_stats` of an EaModel."""
    count = TauCount()
    device = model.target.get_input_embeddings().weight.device
    for ids in prompts:
        model.eagenerate(ids.to(device), temperature=0.0, max_new_tokens=max_new_tokens)
        count.new_tokens += model.last_stats.new_tokens
        count.steps += model.last_stats.steps
    return count


def judge_wanted(tau_every: int, min_steps: int, total_steps: int) -> bool:
    """Whether a run measures τ: asked for (tau_every > 0) and at least `min_steps` optimizer steps long.
    A shorter run skips it and logs one line saying so (its decoding would outlast the training)."""
    if not tau_every:
        return False
    if total_steps < min_steps:
        log.info("τ judge skipped: %d optimizer steps < train.tau_min_steps=%d (greedy decoding of the held-back "
                 "prompts takes minutes on a CPU; set train.tau_min_steps=0 to measure anyway)", total_steps, min_steps)
        return False
    return True


class Judge:
    """Measures τ of heads on a fixed prompt list with one frozen target.

    `load_target` is called once, on the first measurement. `tokenizer` (optional) only
    supplies EOS ids to the decoder; prompts are already token ids.
    """

    def __init__(self, prompts: list[torch.Tensor], load_target: Callable[[], nn.Module], max_new_tokens: int = 64,
                 tokenizer=None, trees: dict[str, TreeSettings] | None = None):
        self.prompts, self.max_new_tokens, self.tokenizer = prompts, max_new_tokens, tokenizer
        self.trees = dict(TREES if trees is None else trees)
        self._load_target = load_target
        self._target: nn.Module | None = None

    @classmethod
    def from_target_dir(cls, target_dir: str | Path, texts: list[str], max_new_tokens: int = 64,
                        dtype: torch.dtype = torch.bfloat16, chat_template: str | None = None,
                        device: torch.device | str = "cpu", target: nn.Module | None = None,
                        tokenizer: Callable[[], object] | None = None) -> Judge:
        """Tokenize `texts` with the target's chat template now; load the target on first use (or use
        `target`, already loaded in `dtype`: online training's). `tokenizer` returns the job's tokenizer
        when the caller holds one (a training run loads it once); else it is loaded from `target_dir`."""
        try:
            tokenizer = tokenizer() if tokenizer is not None else load_tokenizer(target_dir, chat_template)
        except (OSError, ValueError) as e:
            raise ValueError(f"{target_dir}: no usable tokenizer with a chat template, which τ on chat prompts "
                             f"needs (set train.tau_every=0 to turn it off): {str(e).splitlines()[0]}") from e
        load = (lambda: target) if target is not None else (lambda: load_target(target_dir, dtype, device))
        return cls(encode_prompts(tokenizer, texts), load, max_new_tokens, tokenizer)

    @property
    def target(self) -> nn.Module:
        if self._target is None:
            start = time.perf_counter()
            self._target = self._load_target()
            log.info("τ judge: target loaded in %.1f s", time.perf_counter() - start)
        return self._target

    @property
    def dtype(self) -> torch.dtype:
        return self.target.get_input_embeddings().weight.dtype

    def measure(self, head: Head) -> Acceptance:
        """τ of `head` (in the target's dtype) under every tree of the judge."""
        result = Acceptance()
        start = time.perf_counter()
        log.info("τ judge: decoding %d prompts x %d tokens with %d trees", len(self.prompts), self.max_new_tokens,
                 len(self.trees))
        for name, tree in self.trees.items():
            model = EaModel(self.target, head, self.tokenizer, tree, compile=False)  # τ only: no compile
            result.counts[name] = count_tau(model, self.prompts, self.max_new_tokens)
        result.seconds = time.perf_counter() - start
        log.info("τ judge: %s in %.0f s", ", ".join(f"tau_{n} {c.tau:.2f}" for n, c in result.counts.items()),
                 result.seconds)
        return result

    def measure_state(self, state: dict[str, torch.Tensor], config: DraftConfig,
                      draft_ids: torch.Tensor | None = None) -> Acceptance:
        """`measure` of a head built from full weights; the global RNG state is left as it was.

        Non-finite weights (a diverged run) give τ = nan instead of decoding garbage drafts.
        """
        if not all(bool(torch.isfinite(v).all()) for v in state.values()):
            log.warning("τ judge: the head has non-finite weights; reporting tau = nan")
            return Acceptance({name: TauCount() for name in self.trees})
        with torch.random.fork_rng(devices=[]):  # DraftHead init and model loading draw from it
            head = head_from_state(state, config, draft_ids).to(self.target.device, self.dtype).eval()
            return self.measure(head)
