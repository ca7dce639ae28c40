"""Judging a head by real decoding: τ on held-back chat prompts while it trains.

Held-out top-1 says how often the draft's next token is right given the target's *true*
features; τ (new tokens per target forward) is what decoding gains once the head drafts
several tokens on its own predictions. The two can disagree, so the trainer reports both.

    judge = Judge.from_target_dir(target_dir, held_back_prompts("mtbench", 8), max_new_tokens=64)
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

from eagle.checkpoint import Head, build_head
from eagle.draft import DraftConfig
from eagle.targets import load_target, load_tokenizer
from eagle.tree import Choices

log = logging.getLogger("train")

CHAIN: Choices = [[0] * d for d in range(1, 6)]  # [[0], [0, 0], ..., [0, 0, 0, 0, 0]]
TREES: dict[str, str | Choices] = {"tree": "dynamic", "chain": CHAIN}


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


# ---- prompts ---------------------------------------------------------------------------------


def held_back_prompts(name: str, n: int) -> list[str]:
    """First turns of `n` questions of an eagle.bench prompt set, categories interleaved.

    `name` is what `eagle.bench.load_questions` reads (`mtbench`, `sharegpt-heldout`, a JSONL
    path). MT-bench lists its questions category by category; taking them round-robin makes
    8 prompts cover its 8 categories.
    """
    from eagle.bench import load_questions

    questions = load_questions(name)
    seen: dict[str, int] = {}
    ranked = []  # (rank within its category, original index, text)
    for i, q in enumerate(questions):
        seen[q.category] = seen.get(q.category, 0) + 1
        ranked.append((seen[q.category], i, q.turns[0]))
    return [text for _, _, text in sorted(ranked)[:n]]


def encode_prompts(tokenizer, texts: list[str]) -> list[torch.Tensor]:
    """One user turn each, through the chat template with the generation prompt. [1, S_i] each"""
    out = []
    for text in texts:
        enc = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)
        out.append(enc["input_ids"])
    return out


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


def head_from_state(state: dict[str, torch.Tensor], config: DraftConfig, dtype: torch.dtype,
                    draft_ids: torch.Tensor | None = None) -> Head:
    """A head in `dtype` from a full state dict (e.g. train.engine.full_state_dict) and its draft vocabulary."""
    head = build_head(config)
    head.load_state_dict({k: v.float() for k, v in state.items()})
    head.draft_ids = draft_ids
    return head.to(dtype).eval().requires_grad_(False)


class Judge:
    """Measures τ of heads on a fixed prompt list with one frozen target.

    `load_target` is called once, on the first measurement. `tokenizer` (optional) only
    supplies EOS ids to the decoder; prompts are already token ids.
    """

    def __init__(self, prompts: list[torch.Tensor], load_target: Callable[[], nn.Module], max_new_tokens: int = 64,
                 tokenizer=None, trees: dict[str, str | Choices] | None = None):
        self.prompts, self.max_new_tokens, self.tokenizer = prompts, max_new_tokens, tokenizer
        self.trees = dict(TREES if trees is None else trees)
        self._load_target = load_target
        self._target: nn.Module | None = None

    @classmethod
    def from_target_dir(cls, target_dir: str | Path, texts: list[str], max_new_tokens: int = 64,
                        dtype: torch.dtype = torch.bfloat16, chat_template: str | None = None,
                        device: torch.device | str = "cpu") -> Judge:
        """Tokenize `texts` with the target's chat template now; load the target on first use."""
        try:
            tokenizer = load_tokenizer(target_dir, chat_template)
        except (OSError, ValueError) as e:
            raise ValueError(f"{target_dir}: no usable tokenizer with a chat template, which τ on chat prompts "
                             f"needs (set train.tau_every=0 to turn it off): {str(e).splitlines()[0]}") from e
        return cls(encode_prompts(tokenizer, texts), lambda: load_target(target_dir, dtype, device, attn_implementation="sdpa"), max_new_tokens,
                   tokenizer)

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
        from eagle.model import EaModel

        result = Acceptance()
        start = time.perf_counter()
        for name, tree in self.trees.items():
            model = EaModel(self.target, head, self.tokenizer, tree=tree)
            result.counts[name] = count_tau(model, self.prompts, self.max_new_tokens)
        result.seconds = time.perf_counter() - start
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
            head = head_from_state(state, config, self.dtype, draft_ids).to(self.target.device)
            return self.measure(head)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """`python -m train.acceptance HEAD_DIR`: τ of an exported head, as the trainer measures it."""
    import argparse
    import json

    from eagle.checkpoint import load_head
    from eagle.targets import resolve_target

    ap = argparse.ArgumentParser(description="τ of a draft head by greedy decoding of held-back prompts.")
    ap.add_argument("head", help="exported head directory")
    ap.add_argument("--base", default="smollm2-135m-instruct", help="target: alias, folder or Hub id")
    ap.add_argument("--prompts", default="sharegpt-heldout", help="mtbench | sharegpt-heldout | MT-bench-shaped JSONL")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    judge = Judge.from_target_dir(resolve_target(args.base), held_back_prompts(args.prompts, args.num_prompts),
                                  args.max_new_tokens, dtype)
    metrics = judge.measure(load_head(args.head, dtype=dtype)).metrics()
    print(json.dumps({"head": args.head, **vars(args), **metrics}))
    return metrics


if __name__ == "__main__":
    main()
