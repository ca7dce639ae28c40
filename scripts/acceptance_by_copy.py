"""Where does a head lose τ on MT-bench: on text it could copy, or on free text? (docs/recipes.md)

    .venv/bin/python scripts/acceptance_by_copy.py [HEAD ...] [--per-category 2] [--sharegpt 16]

Decodes the first turns of MT-bench and of held-out ShareGPT greedily with each head and the
60-node EAGLE-2 tree, then labels every new token twice:
- drafted: the head proposed it and the target accepted it (otherwise the target's bonus token);
- copy: it follows the same two tokens somewhere earlier (prompt or reply so far), which is
  what prompt lookup, or a head that learned to copy, predicts easily.

τ = tokens per target forward, so the drafted share is 1 − 1/τ. Splitting it by copy / free
tokens tells whether a prompt set is harder because it has fewer copies or because the head
is worse on its free text.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

from eagle.bench import first_per_category, load_questions, sharegpt_heldout
from eagle.checkpoint import load_head
from eagle.model import EaModel
from eagle.targets import load_target, load_tokenizer, resolve_target


@dataclass
class Split:
    """Token counts of one head on one prompt set."""

    tokens: int = 0
    steps: int = 0
    copy: int = 0
    copy_drafted: int = 0
    free: int = 0
    free_drafted: int = 0

    def add(self, drafted: list[bool], copied: list[bool], steps: int) -> None:
        self.tokens += len(drafted)
        self.steps += steps
        for d, c in zip(drafted, copied):
            if c:
                self.copy, self.copy_drafted = self.copy + 1, self.copy_drafted + d
            else:
                self.free, self.free_drafted = self.free + 1, self.free_drafted + d

    def row(self) -> str:
        share = lambda a, b: a / b if b else float("nan")  # noqa: E731
        return (f"τ {share(self.tokens, self.steps):.2f} | {self.tokens} | {share(self.copy, self.tokens):.3f} | "
                f"{share(self.copy_drafted, self.copy):.3f} | {share(self.free_drafted, self.free):.3f}")


def drafted_flags(accept_lengths: list[int], new_tokens: int) -> list[bool]:
    """Per new token: True if it was a draft the target accepted. The first token comes from the
    prefill; each step then yields (accepted drafts, then one bonus token). [new_tokens]"""
    flags = [False]
    for a in accept_lengths:
        flags += [True] * (a - 1) + [False]
    return flags[:new_tokens]


def copy_flags(seq: list[int], prompt_len: int) -> list[bool]:
    """Per new token j: (seq[j-2], seq[j-1], seq[j]) occurs earlier in seq, ending before j."""
    seen: set[tuple[int, ...]] = {tuple(seq[i:i + 3]) for i in range(prompt_len - 2)}
    out = []
    for j in range(prompt_len, len(seq)):
        gram = tuple(seq[j - 2:j + 1])
        out.append(gram in seen)
        seen.add(gram)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("heads", nargs="*", default=["checkpoints/eagle-smollm2-135m-instruct"])
    ap.add_argument("--base", default="smollm2-135m-instruct")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--sharegpt", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target_dir = resolve_target(args.base)
    tok, target = load_tokenizer(target_dir), load_target(target_dir, "bfloat16", attn_implementation="sdpa")
    sets = {"mtbench": first_per_category(load_questions("mtbench"), args.per_category),
            "sharegpt-heldout": sharegpt_heldout(args.sharegpt)}
    print("| head | prompts | τ | new tokens | copy share | drafted, copy tokens | drafted, free tokens |")
    print("|---|---|---|---:|---:|---:|---:|")
    for path in args.heads:
        model = EaModel(target, load_head(path, dtype=torch.bfloat16), tok, total_token=60, depth=6, top_k=10)
        for name, questions in sets.items():
            split = Split()
            for q in questions:
                ids = tok.apply_chat_template([{"role": "user", "content": q.turns[0]}], add_generation_prompt=True,
                                              return_tensors="pt", return_dict=True)["input_ids"]  # [1, P]
                out = model.eagenerate(ids, temperature=0.0, max_new_tokens=args.max_new_tokens)  # [1, P + N]
                stats = model.last_stats
                split.add(drafted_flags(stats.accept_lengths, stats.new_tokens),
                          copy_flags(out[0].tolist(), ids.shape[1]), stats.steps)
            print(f"| {path} | {name} ({len(questions)}) | {split.row()} |", flush=True)


if __name__ == "__main__":
    main()
