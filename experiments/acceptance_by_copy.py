"""Where does a head lose τ on MT-bench: on text it could copy, or on free text? (docs/findings.md)

    python -m experiments.acceptance_by_copy [HEAD ...] [--per-category 2] [--sharegpt 16] [--draft-vocab N]

Decodes the first turns of MT-bench and of held-out ShareGPT greedily with each head and the
60-node EAGLE-2 tree, then labels every new token twice:
- drafted: the head proposed it and the target accepted it (otherwise the target's bonus token);
- copy: it follows the same two tokens somewhere earlier (prompt or reply so far), which is
  what prompt lookup, or a head that learned to copy, predicts easily.

τ = tokens per target forward, so the drafted share is 1 − 1/τ. Splitting it by copy / free
tokens tells whether a prompt set is harder because it has fewer copies or because the head
is worse on its free text. The last column is the share of new tokens outside the draft
vocabulary the decoder proposes from (`--draft-vocab`, as in evaluation.bench): the head can never
draft those.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle.decoding.settings import TreeSettings
from eagle.heads.checkpoint import load_head
from eagle.model import EaModel
from experiments.diagnostic_prompts import first_turn_ids, parser, setup


@dataclass
class Split:
    """Token counts of one head on one prompt set."""

    tokens: int = 0
    steps: int = 0
    copy: int = 0
    copy_drafted: int = 0
    free: int = 0
    free_drafted: int = 0
    outside: int = 0  # new tokens outside the draft vocabulary

    def add(self, drafted: list[bool], copied: list[bool], steps: int, outside: int = 0) -> None:
        self.tokens += len(drafted)
        self.steps += steps
        self.outside += outside
        for d, c in zip(drafted, copied):
            if c:
                self.copy, self.copy_drafted = self.copy + 1, self.copy_drafted + d
            else:
                self.free, self.free_drafted = self.free + 1, self.free_drafted + d

    def row(self) -> str:
        share = lambda a, b: a / b if b else float("nan")  # noqa: E731
        return (f"τ {share(self.tokens, self.steps):.2f} | {self.tokens} | {share(self.copy, self.tokens):.3f} | "
                f"{share(self.copy_drafted, self.copy):.3f} | {share(self.free_drafted, self.free):.3f} | "
                f"{share(self.outside, self.tokens):.3f}")


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
    ap = parser(__doc__, "python -m experiments.acceptance_by_copy")
    ap.add_argument("heads", nargs="*", default=["checkpoints/eagle-smollm2-135m-instruct"])
    ap.add_argument("--draft-vocab", type=int, default=None, help="as evaluation.bench's (the target's vocabulary size: all)")
    args = ap.parse_args()
    tok, target, sets = setup(args)
    print("| head | prompts | τ | new tokens | copy share | drafted, copy tokens | drafted, free tokens | outside the draft vocabulary |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for path in args.heads:
        settings = TreeSettings(total_token=60, depth=6, top_k=10, draft_vocab=args.draft_vocab, lookup=0)
        model = EaModel(target, load_head(path, dtype=target.dtype), tok, settings, compile=False)  # τ only
        ids = model.drafter.vocab.ids
        vocab = None if ids is None else set(ids.tolist())
        for name, questions in sets.items():
            split = Split()
            for q in questions:
                ids = first_turn_ids(tok, q)  # [1, P]
                out = model.eagenerate(ids, temperature=0.0, max_new_tokens=args.max_new_tokens)  # [1, P + N]
                stats, new = model.last_stats, out[0, ids.shape[1]:].tolist()
                outside = 0 if vocab is None else sum(t not in vocab for t in new)
                split.add(drafted_flags(stats.accept_lengths, stats.new_tokens),
                          copy_flags(out[0].tolist(), ids.shape[1]), stats.steps, outside)
            print(f"| {path} | {name} ({len(questions)}) | {split.row()} |", flush=True)


if __name__ == "__main__":
    main()
