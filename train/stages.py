"""A head's training stages: every run on the way to it, oldest first, kept beside the head.

A head trained from scratch has one stage; a fine-tune (`train.init_head`) has its starting head's
stages plus its own. They are written to `training.json` in every exported layout, so that the
model card of a head trained slice by slice across sessions lists all the data it saw.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

STAGES_FILE = "training.json"


@dataclass
class Stage:
    """One training run: what it trained on and for how long."""

    data: str  # the data selection and its store
    records: int
    tokens: int
    steps: int
    epochs: float
    vocab_coverage: float | None = None  # share of its training tokens inside the draft vocabulary
    code_version: str = "unknown"
    draft_vocab: int | None = None  # the draft vocabulary's size (None: the whole vocabulary, or not recorded)
    lr: float | None = None  # the schedule's peak learning rate (None: not recorded)

    def line(self) -> str:
        """The stage as the model card lists it."""
        size = "" if self.draft_vocab is None else f" ({self.draft_vocab:,} tokens)"
        cover = "" if self.vocab_coverage is None else f"; the draft vocabulary{size} covers {self.vocab_coverage:.2%} of its tokens"
        lr = "" if self.lr is None else f", peak lr {self.lr:g}"
        return (f"`{self.data}` ({self.records:,} records, {self.tokens:,} tokens): {self.steps} steps "
                f"({self.epochs:.2f} epochs{lr}){cover}")


def read_stages(head_dir: str | Path) -> list[Stage]:
    """The stages recorded beside the head in the folder `head_dir`; none for a head exported without them."""
    path = Path(head_dir) / STAGES_FILE
    if not path.is_file():
        log.warning("%s has no %s: the new card lists this run's stage only", head_dir, STAGES_FILE)
        return []
    try:
        return [Stage(**raw) for raw in json.loads(path.read_text())["stages"]]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a list of training stages ({e})") from None


def stages_text(stages: list[Stage]) -> str:
    """`training.json`'s text."""
    return json.dumps({"stages": [asdict(s) for s in stages]}, indent=1) + "\n"
