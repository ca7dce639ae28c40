"""What one trainer of the parity comparison is given and what it gives back (`python -m evaluation.parity`).

Every trainer, ours or a reference one run in its own venv, trains on the same records of one
of our feature stores, for the same number of optimizer steps, over the same draft vocabulary,
under a `Recipe`; it returns a `TrainerRun`: a head folder our `load_head` reads, its curves
and its wall time. The judge (evaluation/parity.py) then decodes with every head alike.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Recipe:
    """Training settings one trainer runs with. `name`: "reference" (the trainer's documented
    defaults) or "ours" (our shipped recipe), so recipe and code differences can be told apart."""

    name: str
    steps: int  # optimizer steps
    batch_tokens: int  # tokens per optimizer step (one micro-batch: padded length x rows, or one packed row)
    lr: float
    schedule: str  # linear | cosine | constant
    warmup_steps: int
    weight_decay: float
    ttt_steps: int  # training-time-test passes (1 = plain EAGLE)
    ttt_decay: float  # pass i's loss weighs ttt_decay**i
    loss: str  # "ce" (soft cross-entropy against the target's distribution) | "kl_div" | EAGLE-1/2's "feature+ce"
    optimizer: str = "adamw"
    min_lr_ratio: float = 0.0
    seed: int = 0
    freeze_lm_head: bool = False  # EAGLE-3: the head's lm_head stays the target's rows (speculators' default)

    def changed(self, assignments: list[str]) -> Recipe:
        """This recipe with `FIELD=VALUE` assignments applied, each value read as its field's type."""
        fields = {f.name: f for f in dataclasses.fields(self)}
        changes = {}
        for assignment in assignments:
            key, eq, raw = assignment.partition("=")
            if not eq or key not in fields or key in ("name", "steps", "batch_tokens"):
                raise ValueError(f"recipe change {assignment!r}: expected FIELD=VALUE, FIELD one of "
                                 f"{', '.join(k for k in fields if k not in ('name', 'steps', 'batch_tokens'))}")
            kind = type(getattr(self, key))
            changes[key] = raw.lower() in ("1", "true", "yes") if kind is bool else kind(raw)
        return dataclasses.replace(self, **changes)


@dataclass
class CurvePoint:
    """One logged optimizer step of a trainer: its training loss and draft accuracy."""

    step: int
    loss: float
    top1: float | None = None  # first TTT pass (depth 1): draft argmax == target argmax on loss-masked rows


@dataclass
class TrainerRun:
    """The outcome of one trainer on the parity data."""

    trainer: str  # e.g. "ours-eagle3", "speculators", "ours-eagle2", "eagle-llm"
    recipe: Recipe
    head_dir: Path  # a head folder `eagle.heads.checkpoint.load_head` reads
    seconds: float  # wall time of the training loop (data loading included, model loading not)
    tokens: int  # tokens the trainer consumed over all its steps (all positions, not only loss-masked)
    curve: list[CurvePoint] = field(default_factory=list)
    command: str = ""  # how it was launched, for the report

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def to_json(self) -> dict:
        out = asdict(self)
        out["head_dir"] = str(self.head_dir)
        out["tokens_per_s"] = self.tokens_per_s
        return out

    @classmethod
    def from_json(cls, raw: dict) -> "TrainerRun":
        raw = dict(raw)
        raw.pop("tokens_per_s", None)
        return cls(**{**raw, "recipe": Recipe(**raw["recipe"]), "head_dir": Path(raw["head_dir"]),
                      "curve": [CurvePoint(**p) for p in raw.get("curve", [])]})

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1))
