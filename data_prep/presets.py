"""The model presets of conf/model/ and a one-line error for an unknown `+model=NAME`.

Hydra reports a missing config file with a multi-line message from inside its composition;
the entry points check `+model=NAME` first, so a typo gets one line that lists the choices.
"""

from __future__ import annotations

from pathlib import Path

CONF = Path(__file__).resolve().parent.parent / "conf"


def model_presets(conf: Path = CONF) -> list[str]:
    return sorted(p.stem for p in (conf / "model").glob("*.yaml"))


def unknown_model(argv: list[str], conf: Path = CONF) -> str | None:
    """The error line for a `+model=NAME` (or `model=NAME`) naming no preset, else None."""
    presets = model_presets(conf)
    for arg in argv:
        key, _, name = arg.lstrip("+").partition("=")
        if key == "model" and name and name not in presets:
            return (f"error: no model preset '{name}' (conf/model/{name}.yaml); choose one of "
                    f"{', '.join(presets)}, or add a file there for your target")
    return None
