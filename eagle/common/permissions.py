"""Modes of what is written atomically: a temp folder or file renamed into place keeps the private
modes `tempfile.mkdtemp` (0700), `mkstemp` and safetensors (0600) give it, so a head, a converted
target or a tuned budget would be unreadable by the rest of a team sharing the disk.
`as_if_created` gives them the modes a plain `mkdir`/`open` would have under this process's umask.

    as_if_created(tmp)   # a folder or a file, before os.replace(tmp, final)
"""

from __future__ import annotations

import os
from pathlib import Path


def current_umask() -> int:
    """This process's umask (read by setting and restoring it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def as_if_created(path: str | Path) -> None:
    """chmod `path` (a file, or a folder and everything under it) to 0777 (folders) / 0666 (files)
    less the umask."""
    mask = current_umask()
    root = Path(path)
    for one in [root, *(root.rglob("*") if root.is_dir() else ())]:
        if not one.is_symlink():
            os.chmod(one, (0o777 if one.is_dir() else 0o666) & ~mask)
