"""EAGLE speculative decoding: draft head, trees, verification and the `EaModel` decoder.

`from eagle import EaModel` imports the decoder lazily, so `import eagle.heads.eagle2` (used by
training) stays light and importing the package has no side effects.
"""

from __future__ import annotations

__all__ = ["EaModel"]


def __getattr__(name: str):
    if name == "EaModel":
        from eagle.model import EaModel

        return EaModel
    raise AttributeError(f"module 'eagle' has no attribute {name!r}")
