"""Would a chain looked up in a datastore of earlier text add to prompt lookup, beside the head's tree?

    python -m experiments.datastore_chain [--head DIR] [--per-category 5] [--positions 160] [--threads 2]
        [--store NAME=text:SOURCE:N] [--store NAME=target:SOURCE:N]

Retrieval drafting (REST; SuffixDecoding over a server's earlier outputs) proposes what followed the context's last
tokens in a corpus, where prompt lookup (eagle/decoding/prompt_lookup.py) looks in the context alone. This measures
what such a chain would add to our decoder without building it:

1. **The head's trees, at every position** of the target's greedy replies to MT-bench first turns (`--per-category`
   questions of each category, `--positions` tokens each): what every tree of 2, 4 and 8 nodes and depth 1-3 accepts
   there, from one verify of the largest pool (the tuner's calibration, eagle/tuning/tuner.py `Calibration`).
2. **The stores.** `text:SOURCE:N`: the assistant turns of the first N conversations of SOURCE as written;
   `target:SOURCE:N`: the target's greedy replies (256 tokens at most) to their first user turns, written here by
   data_prep's batched engine. A store's chain at a position: the longest of the context's last 4..2 tokens found in
   it, then token by token the continuation most of its occurrences share (`Store.chain`). The index is Python
   dicts: the process held 5.6 GB with 3.2M tokens of stores.
3. **The walk** (tuner.py `walk_tau`): from a position, a step accepts the longer of the tree's path and the root
   plus the chain's matching prefix, and moves past them. Prints, per tree and chain length L, τ with prompt lookup
   alone and with the store's chain wherever prompt lookup finds none, and the chain rows a step verifies on
   average (each costs verify time: docs/speed.md, "Where a step's time goes"). Tree `1/0` is the root alone:
   the chains without the head.
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter, defaultdict

import torch

from data_prep.batched_decoding import BatchedDecoding
from data_prep.conversations import read_conversations
from data_prep.data_config import RegenConfig
from data_prep.prompt_sets import first_per_category, load_questions
from data_prep.reply_requests import generate
from eagle.decoding.prompt_lookup import lookup_chain, matched_length
from eagle.model import EaModel
from eagle.targets.tokenizer import chat_prompt
from eagle.tuning.tuner import Calibration, walk_steps
from experiments.diagnostic_prompts import first_turn_ids

TREES = ((2, 1), (4, 2), (4, 3), (8, 3))  # (nodes, depth) compared
CHAINS = (2, 4, 8)  # chain lengths compared
NGRAMS = (4, 3, 2)  # context suffixes a store looks up, longest first
REPLY_TOKENS = 256  # the target's replies in a `target:` store
PROMPT_TOKENS = 768  # the last tokens of a `target:` store's prompts its engine reads


class Store:
    """Token sequences indexed by their n-grams (n in NGRAMS): what followed a context's last tokens."""

    def __init__(self, seqs: list[list[int]]):
        self.seqs = seqs
        self.index: dict[tuple[int, ...], list[tuple[int, int]]] = defaultdict(list)  # n-gram -> (seq, next index)
        for s, seq in enumerate(seqs):
            for n in NGRAMS:
                for i in range(len(seq) - n):
                    self.index[tuple(seq[i:i + n])].append((s, i + n))

    @property
    def tokens(self) -> int:
        return sum(len(s) for s in self.seqs)

    def chain(self, context: list[int], length: int) -> list[int]:
        """Up to `length` tokens after the longest of the context's last NGRAMS tokens found: at each step the token
        that most of the occurrences still followed have next ([] when no suffix is found)."""
        for n in NGRAMS:
            hits = self.index.get(tuple(context[-n:])) if len(context) >= n else None
            if hits:
                return self._follow(hits, length)
        return []

    def _follow(self, hits: list[tuple[int, int]], length: int) -> list[int]:
        out = []
        while len(out) < length:
            counts = Counter(self.seqs[s][i] for s, i in hits if i < len(self.seqs[s]))
            if not counts:
                break
            token = counts.most_common(1)[0][0]
            out.append(token)
            hits = [(s, i + 1) for s, i in hits if i < len(self.seqs[s]) and self.seqs[s][i] == token]
        return out


def build_store(spec: str, model: EaModel) -> Store:
    """`text:SOURCE:N` or `target:SOURCE:N` (the module's docstring) as a Store."""
    kind, _, rest = spec.partition(":")
    source, _, count = rest.rpartition(":")
    conversations, _ = read_conversations(source, limit=int(count))
    tok = model.tokenizer
    if kind == "text":
        texts = [m["content"] for c in conversations for m in c.messages if m["role"] == "assistant"]
    elif kind == "target":
        prompts = [chat_prompt(tok, [c.messages[0]])[0, -PROMPT_TOKENS:].tolist() for c in conversations
                   if c.messages[0]["role"] == "user"]
        texts = _target_replies(model, prompts)
    else:
        raise SystemExit(f"--store {spec!r}: expected text:SOURCE:N or target:SOURCE:N")
    return Store([tok(t, add_special_tokens=False)["input_ids"] for t in texts])


def _target_replies(model: EaModel, prompts: list[list[int]]) -> list[str]:
    """The target's greedy replies, through data_prep's batched engine."""
    settings = RegenConfig(max_new_tokens=REPLY_TOKENS, batch_size=64)
    print(f"writing the target's replies to {len(prompts)} prompts (~180 reply tokens/s on 2 cores of a Zen 3)", flush=True)
    engine = BatchedDecoding(model.target, model.tokenizer, settings, max_len=PROMPT_TOKENS + REPLY_TOKENS)
    try:
        return generate(engine, prompts, 0, settings)
    finally:
        engine.close()


def positions(cal: Calibration, prompt_lengths: list[int], stores: dict[str, Store]) -> list[dict]:
    """Per calibration position: (length, leading tokens that match the text after) of the prompt-lookup chain and
    of each store's (at most max(CHAINS) tokens)."""
    out, start, longest = [], 0, max(CHAINS)
    for text, p, end in zip(cal.texts, prompt_lengths, cal.ends, strict=True):
        ids = text[0].cpu()  # [P + T]
        for j in range(end - start):
            context = ids[:p + j]
            chains = {"lookup": lookup_chain(context, longest)}
            chains |= {name: torch.tensor(store.chain(context.tolist(), longest), dtype=torch.long)
                       for name, store in stores.items()}
            out.append({name: (c.numel(), matched_length(c, ids[p + j:p + j + c.numel()])) for name, c in chains.items()})
        start = end
    return out


def walk(accepted: list[int], chain: list[tuple[int, int]], ends: list[int], length: int) -> tuple[float, float]:
    """τ and mean chain rows a step of a tree with chains cut to `length` tokens, walking the texts as the tuner
    does (`walk_steps`): chain[p] = (tokens found, tokens matched) at p."""
    steps = walk_steps(accepted, [m for _, m in chain], ends, length)
    return ends[-1] / len(steps), sum(min(chain[p][0], length) for p in steps) / len(steps)


def report(cal: Calibration, found: list[dict], stores: list[str]) -> None:
    print("| tree | L | lookup: τ | rows | " + " | ".join(f"lookup, else {s}: τ | rows" for s in stores)
          + " |\n|---|---|---|---|" + "---|---|" * len(stores))
    for n, d in ((1, 0),) + TREES:
        accepted = cal.accepted[(n, d)] if n > 1 else [1] * len(found)  # 1/0: the chain alone, no head
        alone = walk(accepted, [f["lookup"] for f in found], cal.ends, 0)[0]
        print(f"| {n}/{d} | 0 | {alone:.3f} | 0 |" + " |" * (2 * len(stores)))
        for length in CHAINS:
            cells = [walk(accepted, [f["lookup"] for f in found], cal.ends, length)]
            cells += [walk(accepted, [f["lookup"] if f["lookup"][0] else f[s] for f in found], cal.ends, length)
                      for s in stores]
            print(f"| {n}/{d} | {length} | " + " | ".join(f"{t:.3f} | {r:.2f}" for t, r in cells) + " |", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m experiments.datastore_chain", description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="smollm2-135m-instruct")
    ap.add_argument("--head", default="checkpoints/eagle3-smollm2-135m-instruct")
    ap.add_argument("--per-category", type=int, default=5, help="MT-bench first turns per category")
    ap.add_argument("--positions", type=int, default=160, help="greedy tokens of each reply scored")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--store", action="append", default=[], metavar="NAME=KIND:SOURCE:N",
                    help="e.g. gpt=text:packaged:sharegpt:3000 or replies=target:packaged:sharegpt:1500")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = EaModel.from_pretrained(args.base, args.head, total_token=max(n for n, _ in TREES),
                                    depth=max(d for _, d in TREES), lookup=0, background=False)
    with torch.inference_mode():
        stores = {name: build_store(spec, model) for name, spec in (s.split("=", 1) for s in args.store)}
        for name, store in stores.items():
            print(f"store {name}: {len(store.seqs)} texts, {store.tokens} tokens", flush=True)
        cal = Calibration.over(sorted({n for n, _ in TREES}), sorted({d for _, d in TREES}))
        questions = first_per_category(load_questions("mtbench"), args.per_category)
        prompts = [first_turn_ids(model.tokenizer, q) for q in questions]
        for ids in prompts:
            cal.decode(model, ids, args.positions)
        found = positions(cal, [p.shape[1] for p in prompts], stores)
    print(f"{len(questions)} MT-bench first turns, {len(found)} positions; chain rows / step beside the tree's, "
          f"median reply {statistics.median(b - a for a, b in zip([0] + cal.ends, cal.ends))} tokens")
    report(cal, found, list(stores))


if __name__ == "__main__":
    main()
