"""Seeded damaged chat files, and the judge of what the reader made of them.

    python -m tests.fuzz_inputs [--cases N] [--seed S]     # the table of docs/reliability.md

Each case is a small ShareGPT/OpenAI-shaped file (a JSON array or JSONL, chosen by the seed)
with one kind of damage. `read_conversations` must end in one of two ways:

- **clean**: it returns, every kept conversation is well formed (optional system turn, then
  user/assistant alternating, ending on a non-empty reply), read = kept + skipped, and every
  record the case did not touch is kept exactly as the clean file gives it (nothing silently
  changed);
- **one-line error**: a `DataError` whose message is one line naming the file.

Anything else (another exception, a hang, a wrong record) fails the case.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from data_prep.conversations import DataError, normalize, read_conversations

WORDS = ["café", "naïve", "déjà", "Straße", "日本語", "emoji 🙂", "plain", "text", "reply", "question"]
KINDS = ("truncate", "wrong_type", "unknown_role", "empty_turn", "encoding", "nul", "huge", "duplicate_id",
         "garbage")


@dataclass
class Case:
    kind: str
    path: Path
    records: list[dict]  # the clean records, before the damage
    touched: set[int] = field(default_factory=set)  # indices the damage may have changed or removed
    expect: str = "clean"  # clean: nothing is wrong with the data | error | either


def _text(rng: random.Random, n: int = 6) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _record(rng: random.Random, i: int) -> dict:
    turns = []
    if rng.random() < 0.2:
        turns.append(("system", _text(rng)))
    for _ in range(rng.randint(1, 3)):
        turns += [("user", _text(rng)), ("assistant", _text(rng, 10))]
    if rng.random() < 0.5:  # ShareGPT
        names = {"system": "system", "user": "human", "assistant": "gpt"}
        return {"id": f"r{i}", "conversations": [{"from": names[r], "value": t} for r, t in turns]}
    return {"id": f"r{i}", "messages": [{"role": r, "content": t} for r, t in turns]}


def _damage(kind: str, rng: random.Random, records: list[dict]) -> tuple[list, set[int], str | None]:
    """(records as written, touched indices, an encoding or None for UTF-8). Damage that leaves
    every record readable (a role, an empty turn, a BOM, duplicates...) must still read clean."""
    out = json.loads(json.dumps(records))
    i = rng.randrange(len(out))
    turns = out[i].get("conversations") or out[i].get("messages")
    text_key = "value" if "conversations" in out[i] else "content"
    role_key = "from" if "conversations" in out[i] else "role"
    if kind == "wrong_type":
        target = rng.choice(["turns", "turn", "text", "role"])
        bad = rng.choice([5, None, "str", {"a": 1}, [1, 2], 2.5, True])
        if target == "turns":
            out[i]["conversations" if "conversations" in out[i] else "messages"] = bad
        elif target == "turn":
            turns[rng.randrange(len(turns))] = bad
        else:
            turns[rng.randrange(len(turns))][text_key if target == "text" else role_key] = bad
    elif kind == "unknown_role":
        turns[rng.randrange(len(turns))][role_key] = rng.choice(["narrator", "tool", "", "USER ", "🙂"])
    elif kind == "empty_turn":
        turns[rng.randrange(len(turns))][text_key] = rng.choice(["", "   ", "\n\t"])
    elif kind == "huge":
        turns[-1][text_key] = _text(rng, 1) * 40_000  # far above any max_len
    elif kind == "duplicate_id":
        out.insert(i, json.loads(json.dumps(out[i])))
        return out, set(range(i, len(out))), None  # later indices shift by one
    elif kind == "garbage":
        choice = rng.randrange(3)
        if choice == 0:
            out[i] = rng.choice([[1, [2, [3]]], "text", 7, None])
        elif choice == 1:
            turns[0][text_key] = {"deep": [[[{"x": [None]}]]]}
        else:
            out[i]["extra"] = {"nested": [[{"k": "v"}]] * 3}  # unknown keys are ignored
            return out, set(), None
    elif kind == "nul":
        turns[0][text_key] += "\u0000"  # an escaped NUL is text like any other
        return out, {i}, None
    elif kind == "encoding":
        return out, set(), rng.choice(["utf-8-sig", "utf-16", "utf-32", "latin-1"])
    return out, {i}, None


def make_case(kind: str, seed: int, directory: Path) -> Case:
    rng = random.Random(seed)
    records = [_record(rng, i) for i in range(rng.randint(3, 8))]
    written, touched, encoding = (records, set(), None) if kind == "truncate" else _damage(kind, rng, records)
    expect = "either" if kind in ("wrong_type", "garbage") and touched else "clean"
    if encoding == "latin-1":  # WORDS hold non-ASCII text: not UTF-8, and no way to know what it was
        expect = "error"
    jsonl = rng.random() < 0.5
    text = ("\n".join(json.dumps(r, ensure_ascii=False) for r in written) + "\n" if jsonl
            else json.dumps(written, ensure_ascii=False, indent=rng.choice([None, 1])))
    data = text.encode(encoding or "utf-8", errors="replace" if encoding == "latin-1" else "strict")
    if kind == "truncate":
        data = data[: rng.randrange(len(data) + 1)]
        touched = set(range(len(records)))  # whole records before the cut must survive (checked as clean)
    if kind == "nul" and rng.random() < 0.5:  # a raw NUL byte somewhere in the file
        at = rng.randrange(len(data) + 1)
        data = data[:at] + b"\x00" + data[at:]
        touched, expect = set(range(len(records))), "either"
    path = directory / f"{kind}-{seed}.{'jsonl' if jsonl else 'json'}"
    path.write_bytes(data)
    return Case(kind, path, records, touched, expect)


def well_formed(messages: list[dict]) -> bool:
    body = messages[1:] if messages and messages[0]["role"] == "system" else messages
    roles = [m["role"] for m in body]
    return (bool(body) and roles == ["user", "assistant"] * (len(roles) // 2) and len(roles) % 2 == 0
            and all(isinstance(m["content"], str) and m["content"].strip() for m in body))


def judge(case: Case) -> str:
    """'clean' or 'one-line error'; raises AssertionError (with the file) for anything else."""
    try:
        conversations, report = read_conversations(str(case.path))
    except DataError as e:
        message = str(e)
        assert "\n" not in message and str(case.path) in message, f"{case.path}: not one line naming the file: {message!r}"
        assert case.expect != "clean", f"{case.path}: nothing is wrong with this data, yet: {message}"
        return "one-line error"
    assert case.expect != "error", f"{case.path}: read although it is not UTF-8 text"
    assert report.read == report.kept + sum(report.skipped.values()), f"{case.path}: counts do not add up"
    for c in conversations:
        assert well_formed(c.messages), f"{case.path}: record {c.index} kept malformed: {c.messages}"
    kept = {c.index: c.messages for c in conversations}
    for i, record in enumerate(case.records):
        if i in case.touched or i >= report.read:
            continue
        expected, reason = normalize(record, "clean", i)
        assert kept.get(i) == (expected if reason is None else None), f"{case.path}: record {i} changed silently"
    if case.kind == "truncate":  # records before the cut are the clean ones, exactly
        for i, messages in kept.items():
            assert messages == normalize(case.records[i], "clean", i)[0], f"{case.path}: record {i} changed"
    return "clean"


def run(cases_per_kind: int, seed: int = 0) -> tuple[Counter, float]:
    """Counter of (kind, outcome) over cases_per_kind seeded cases of every kind; seconds taken."""
    outcomes: Counter = Counter()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for kind in KINDS:
            for k in range(cases_per_kind):
                outcomes[kind, judge(make_case(kind, seed * 100_003 + k, Path(tmp)))] += 1
    return outcomes, time.perf_counter() - start


def table(outcomes: Counter) -> str:
    lines = ["| damage | cases | clean (valid records kept exactly) | one-line error |", "|---|---|---|---|"]
    for kind in KINDS:
        clean, error = outcomes[kind, "clean"], outcomes[kind, "one-line error"]
        lines.append(f"| {kind} | {clean + error} | {clean} | {error} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz_inputs", description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=200, help="cases per kind of damage")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    outcomes, seconds = run(args.cases, args.seed)
    print(table(outcomes))
    print(f"\n{sum(outcomes.values())} cases, {seconds:.1f} s, 0 tracebacks, 0 silently wrong records")


if __name__ == "__main__":
    main()
