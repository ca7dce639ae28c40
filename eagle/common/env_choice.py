"""An `EAGLE_*` environment setting that takes one of a few values, checked."""

from __future__ import annotations

import os


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """The value of environment variable `name` (`default` when unset); a ValueError naming it when not in `choices`."""
    value = os.environ.get(name, default)
    if value not in choices:
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(choices)}")
    return value
