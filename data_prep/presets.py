"""Command-line checks before Hydra composes: an unknown `+model=NAME`, a key data_prep ignores.

Hydra reports a missing config file with a multi-line message from inside its composition;
the entry points check `+model=NAME` first, so a typo gets one line that lists the choices.
The config is shared with the trainer, so `python -m data_prep output_dir=DIR` composes fine
and would silently do nothing with DIR: data_prep refuses the trainer's keys by name.
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


DATA_PREP_IGNORES = {  # key (or section) the trainer reads -> what a data_prep user meant
    "output_dir": "store_dir=DIR (where the feature store goes)",
    "train": "nothing here: train.* configures python -m train",
    "wandb": "nothing here: wandb.* configures python -m train",
    "hub": "nothing here: hub.* configures python -m train",
}


def ignored_key(argv: list[str]) -> str | None:
    """The error line for an override data_prep would compose and then never read, else None."""
    for arg in argv:
        key = arg.lstrip("+~").partition("=")[0]
        meant = DATA_PREP_IGNORES.get(key) or DATA_PREP_IGNORES.get(key.partition(".")[0])
        if meant and "=" in arg:
            return f"error: python -m data_prep does not read {key}; did you mean {meant}?"
    return None
