"""What the prompt-set diagnostics (experiments.acceptance_by_copy, experiments.target_confidence)
share: MT-bench's and held-out ShareGPT's first turns, the target, and their options
(docs/findings.md, "Where MT-bench loses τ"); and what the paired A/B runs of one process
(experiments.draft_int8, experiments.greedy_screen) share: their options and prompts."""

from __future__ import annotations

import argparse

import torch

from data_prep.prompt_sets import Question, first_per_category, load_questions, sharegpt_heldout
from eagle.common.precision import fast_dtype
from eagle.targets.resolve import load_target, resolve_target
from eagle.targets.tokenizer import chat_prompt, load_tokenizer


def parser(doc: str, prog: str) -> argparse.ArgumentParser:
    """The options every diagnostic takes; the first line of `doc` is the description."""
    ap = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    ap.add_argument("--base", default="smollm2-135m-instruct")
    ap.add_argument("--per-category", type=int, default=2, help="MT-bench questions per category")
    ap.add_argument("--sharegpt", type=int, default=16, help="held-out ShareGPT conversations")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="auto", help="auto: bf16 where the CPU has bf16 arithmetic, else fp32")
    return ap


def setup(args: argparse.Namespace):
    """(tokenizer, target, {set name: questions}) for parsed options; the target in `--dtype`, as decoding runs it
    (`fast_dtype`: bf16 only where the CPU has bf16 arithmetic, which an emulated bf16 would slow several-fold)."""
    torch.set_num_threads(args.threads)
    target_dir = resolve_target(args.base)
    sets: dict[str, list[Question]] = {
        "mtbench": first_per_category(load_questions("mtbench"), args.per_category),
        "sharegpt-heldout": sharegpt_heldout(args.sharegpt)}
    sets = {name: questions for name, questions in sets.items() if questions}  # 0 of a set: leave it out
    return load_tokenizer(target_dir), load_target(target_dir, fast_dtype(args.dtype)), sets


def first_turn_ids(tok, question: Question) -> torch.Tensor:
    """The chat-templated first turn, ready for the assistant's reply. [1, P]"""
    return chat_prompt(tok, [{"role": "user", "content": question.turns[0]}])


def ab_parser(doc: str, prog: str) -> argparse.ArgumentParser:
    """The options of a paired A/B in one process; the first line of `doc` is the description."""
    ap = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    ap.add_argument("--base", default="smollm2-135m-instruct")
    ap.add_argument("--head", default="checkpoints/eagle3-smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=8, help="MT-bench first turns, one in ten")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    return ap


def mtbench_sample(tok, count: int) -> list[torch.Tensor]:
    """`count` MT-bench first turns, one in ten, chat-templated ([1, P] each)."""
    return [first_turn_ids(tok, q) for q in load_questions("mtbench")[::10][:count]]
