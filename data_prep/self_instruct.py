"""Chats the target writes alone: it asks the questions and answers them (Magpie-style).

    python -m data_prep.self_instruct +model=smollm2_135m +n=512 +out=data/self-instruct-512.json

A chat model has learnt what users ask. Rendering its chat template up to the point where a
user's message starts (the system prompt and the user header) and *sampling* from there
makes it write a user question; answering that question greedily, as `data.regenerate` does
for ShareGPT's questions, gives a conversation entirely in the target's own words, on
whatever topics the target expects to be asked about. No dataset is needed, and the
questions are not bounded by the topics of one (ShareGPT's first 4,096 chats here).

The output is a ShareGPT JSON file (`from`/`value` turns) that `data=sharegpt_local` reads:

    python -m data_prep +model=smollm2_135m data=sharegpt_local data.source=data/self-instruct-512.json

Questions are sampled at `+question_temperature` (1.0) and `+question_top_p` (0.95), up to
`+question_tokens` (96) tokens; empty, very short and duplicate questions are dropped and more
are sampled. `+turns=2` adds a follow-up: the target samples the next user message after its
own reply, the way it sampled the first question, and answers it (MT-bench's shape). `+openers=FILE` (one opener per line, e.g. conf/self_instruct/openers.txt) starts
the questions of each batch with those words in turn, to steer them toward kinds the target
seldom asks itself (extraction from a passage, science, history...). Replies follow `data.regen` (greedy, `max_new_tokens`). The file is written
once at the end (to a temporary name, then renamed).
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from collections.abc import Sequence
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig

from data_prep.conversations import Conversation
from data_prep.data_config import prep_config, resolve
from data_prep.regenerate import CHUNK_SEEDS, ReplyGenerator
from data_prep.reply_engines import open_engine
from data_prep.resolvers import register_resolvers
from data_prep.store import write_json_atomic

log = logging.getLogger("data_prep")

_MARK = "\u2063QUESTION\u2063"  # a string no template adds by itself


def question_prefix(tokenizer, history: Sequence[dict] = ()) -> list[int]:
    """Token ids of the chat template up to where the next user message's text starts: the
    first one, or the one after `history` (earlier messages, for a follow-up question)."""
    text = tokenizer.apply_chat_template([*history, {"role": "user", "content": _MARK}], tokenize=False)
    if _MARK not in text:
        raise ValueError("the chat template drops the user's text: cannot find where a question starts")
    return tokenizer(text[: text.index(_MARK)], add_special_tokens=False)["input_ids"]


def _key(question: str) -> str:
    """What two questions must differ in to count as different: words, case and spacing aside."""
    return " ".join(re.findall(r"\w+", question.lower()))


def sample_questions(generator: ReplyGenerator, n: int, batch_size: int, min_words: int = 4,
                     max_rounds: int | None = None, openers: Sequence[str] = ()) -> list[str]:
    """Up to `n` distinct questions, sampled in batches from the template's user header.

    With `openers`, row i of every batch starts its question with openers[i % len(openers)]
    (the opener is part of the question): a way to ask for kinds of questions the target
    seldom asks itself, such as extraction from a passage.
    """
    prefix = question_prefix(generator.tokenizer)
    starts = [o.strip() for o in openers] or [""]
    prompts = [prefix + generator.tokenizer(o, add_special_tokens=False)["input_ids"] if o else prefix for o in starts]
    questions: list[str] = []
    seen: set[str] = set()
    rounds = max_rounds if max_rounds is not None else 4 * (-(-n // batch_size))
    for _ in range(rounds):
        rows = [i % len(starts) for i in range(batch_size)]
        for i, text in zip(rows, generator.decode_batch([prompts[i] for i in rows])):
            question = _join(starts[i], text)
            key = _key(question)
            if len(key.split()) >= min_words + len(starts[i].split()) and key not in seen:
                seen.add(key)
                questions.append(question)
        log.info("self_instruct: %d/%d distinct questions", len(questions), n)
        if len(questions) >= n:
            break
    return questions[:n]


def _join(opener: str, text: str) -> str:
    """The opener and the sampled rest (which decode stripped), with a space between words."""
    if not opener:
        return text
    return opener + ("" if text[:1] in ",.:;?!)" else " ") + text


def read_openers(path: str | None) -> list[str]:
    """One opener per line of a text file; blank lines and `#` comments are skipped."""
    if not path:
        return []
    lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    openers = [line for line in lines if line and not line.startswith("#")]
    if not openers:
        raise ValueError(f"{path}: no openers in this file (one per line)")
    return openers


def answer(generator: ReplyGenerator, questions: list[str]) -> list[Conversation]:
    """One greedy reply per question (`generator.regen` settings), as conversations."""
    chats = [Conversation(i, f"self-{i:05d}", [{"role": "user", "content": q}]) for i, q in enumerate(questions)]
    return next((answered for _, answered in generator.chunks({0: chats}, {0: generator.seed})), [])


def follow_up(asker: ReplyGenerator, replier: ReplyGenerator, chats: list[Conversation],
              min_words: int = 3) -> list[Conversation]:
    """Each chat with one more turn: a user follow-up that the target samples after its own
    reply (`asker` settings), and the greedy answer (`replier`). A chat whose follow-up is too
    short, or whose prompt would not fit in max_len, is kept as it was."""
    budget = asker.max_len - int(asker.regen.max_new_tokens)
    prefixes = {i: question_prefix(asker.tokenizer, c.messages) for i, c in enumerate(chats)}
    sampled = asker.decode_by_length({i: p for i, p in prefixes.items() if len(p) <= budget})
    asks = {i: text for i, text in sampled.items() if len(_key(text).split()) >= min_words}
    log.info("self_instruct: %d/%d chats get a follow-up question", len(asks), len(chats))
    replies = replier.replies({i: chats[i].messages + [{"role": "user", "content": q}] for i, q in asks.items()})
    out = []
    for i, c in enumerate(chats):
        more = [{"role": "user", "content": asks[i]}, {"role": "assistant", "content": replies[i]}] if i in replies else []
        out.append(Conversation(c.index, c.id, c.messages + more))
    return out


def write_sharegpt(conversations: list[Conversation], out: Path) -> None:
    """ShareGPT JSON (`conversations` of `from`/`value` turns), written whole, then renamed."""
    who = {"system": "system", "user": "human", "assistant": "gpt"}
    records = [{"id": c.id, "conversations": [{"from": who[m["role"]], "value": m["content"]} for m in c.messages]}
               for c in conversations]
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out, records)


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    prep = prep_config(cfg)  # the model and data sections; the keys of this script are read below
    n, out = int(cfg.get("n", 512)), Path(str(cfg.get("out", "data/self-instruct.json")))
    torch.manual_seed(prep.seed)
    target = resolve(prep.model)
    tok = target.tokenizer
    regen = prep.data.regen
    engine = open_engine(regen, target.folder, prep.model.dtype, tok, prep.model.max_len)
    asking = replace(regen, temperature=float(cfg.get("question_temperature", 1.0)),
                     top_p=float(cfg.get("question_top_p", 0.95)), max_new_tokens=int(cfg.get("question_tokens", 96)))
    asker = ReplyGenerator(engine, tok, asking, prep.model.max_len, seed=prep.seed * CHUNK_SEEDS)
    replier = ReplyGenerator(engine, tok, regen, prep.model.max_len, seed=(prep.seed + 1) * CHUNK_SEEDS)
    try:
        batch = max(regen.batch_size, 256)  # questions asked a round: every engine batches them itself
        questions = sample_questions(asker, n, batch, openers=read_openers(cfg.get("openers")))
        chats = answer(replier, questions)
        for _ in range(int(cfg.get("turns", 1)) - 1):
            chats = follow_up(asker, replier, chats)
    finally:
        engine.close()
    write_sharegpt(chats, out)
    turns = sum(m["role"] == "user" for c in chats for m in c.messages)
    print(f"{len(chats)} self-instructed conversations, {turns} user turns ({len(questions)} questions asked; "
          f"replies at {replier.tokens_per_s:.0f} tok/s) in {out}")


if __name__ == "__main__":
    register_resolvers()
    main()
