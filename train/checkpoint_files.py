"""Whether this rank can load a DeepSpeed checkpoint folder (output_dir/checkpoints/TAG) as it is.

A save ends with a completion marker, `TAG/.complete`, written by the rank that writes `latest` on
that storage once every rank's files are on disk: it lists each file it sees in TAG with its size.
A folder with the marker is whole when every listed file still has its size. A folder without it,
in a checkpoints folder where others have one, is a save that did not finish. When no folder has a
marker (checkpoints DeepSpeed finished on its own), the files this rank loads decide: the model
states and, when the optimizer is partitioned (ZeRO), this rank's partition must be there, and
each must be a whole zip archive (torch.save's format; a file cut short has no central directory).

    problem(tag_dir, rank, markers_in_use)   # None when this rank can load it, else why not
    write_marker(tag_dir)                    # after every rank wrote its files
    write_text_atomic(path, text)            # `latest` and the marker: whole or absent, never cut
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from pathlib import Path

MARKER = ".complete"
_MODEL = re.compile(r"mp_rank_\d+_model_states\.pt")


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename: a crash leaves the old file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_marker(tag_dir: Path) -> None:
    """TAG/.complete: every file this storage holds in TAG, with its size."""
    files = {p.name: p.stat().st_size for p in sorted(tag_dir.iterdir()) if p.is_file() and p.name != MARKER}
    write_text_atomic(tag_dir / MARKER, json.dumps({"files": files}, indent=1) + "\n")


def problem(tag_dir: Path, rank: int, markers_in_use: bool) -> str | None:
    """Why `rank` cannot load `tag_dir` from its storage (None: it can)."""
    if not tag_dir.is_dir():
        return "no such folder"
    marker = tag_dir / MARKER
    if marker.exists():
        return _listed_problem(marker)
    if markers_in_use:
        return f"no {MARKER} marker: its save did not finish"
    return _files_problem(tag_dir, rank)


def _listed_problem(marker: Path) -> str | None:
    try:
        files = json.loads(marker.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        return f"{marker.name} is unreadable"
    for name, size in files.items():
        path = marker.parent / name
        if not path.exists():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, {size} when saved"
    return None


def _files_problem(tag_dir: Path, rank: int) -> str | None:
    """The model states and this rank's ZeRO files, present and whole (for folders without a marker)."""
    pts = sorted(p.name for p in tag_dir.glob("*.pt"))
    own = re.compile(rf"(?:.*_)?zero_pp_rank_{rank}_mp_rank_\d+_(optim|model)_states\.pt")
    model = [n for n in pts if _MODEL.fullmatch(n)] or [n for n in pts if own.fullmatch(n) and n.endswith("model_states.pt")]
    if not model:
        return "no model states file"
    needed = model
    if any(n.endswith("optim_states.pt") for n in pts):
        partition = [n for n in pts if own.fullmatch(n) and n.endswith("optim_states.pt")]
        if not partition:
            return f"no optimizer partition of rank {rank}"
        needed = model + partition
    for name in needed:
        if _cut(tag_dir / name):
            return f"{name} is cut short"
    return None


def _cut(path: Path) -> bool:
    """Is this torch.save file incomplete? Zip archives must open (their directory is at the end);
    a file in torch's older pickle format cannot be judged and counts as whole."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if not magic:
        return True
    if magic != b"PK\x03\x04":
        return False
    try:
        with zipfile.ZipFile(path):
            return False
    except (zipfile.BadZipFile, OSError):
        return True
