"""Our trainer as one contestant of the parity comparison (evaluation/parity.py): `python -m train` in a
child process, on the parity store, under a `Recipe`, with the same threads as the reference trainers.

    run = train_ours("eagle3", store, "smollm2_135m", out_dir, recipe, threads=2)   # TrainerRun

The run resumes from its own checkpoints when it is started again (train/checkpoints.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

from eagle.common.child_process import child_env, run_logged
from evaluation.parity_run import CurvePoint, Recipe, TrainerRun
from train.tracking import read_metrics

ROOT = Path(__file__).resolve().parent.parent


def ours_recipe(head: str, steps: int, batch_tokens: int) -> Recipe:
    """Our own recipe for SmolLM2 (EAGLE-3: conf/experiment/smollm2_eagle3_ttt7.yaml; EAGLE-1/2:
    conf/model/smollm2_135m.yaml), at `steps` optimizer steps."""
    if head == "eagle3":
        return Recipe("ours", steps, batch_tokens, lr=5e-4, schedule="cosine", warmup_steps=30, weight_decay=0.0,
                      ttt_steps=7, ttt_decay=0.8, loss="ce", min_lr_ratio=0.1)
    return Recipe("ours", steps, batch_tokens, lr=5e-4, schedule="cosine", warmup_steps=100, weight_decay=0.0,
                  ttt_steps=1, ttt_decay=0.8, loss="feature+ce", min_lr_ratio=0.1)


def overrides(head: str, store: Path, model: str, out_dir: Path, recipe: Recipe, draft_vocab: int | None,
              eagle3_norms: bool = False) -> list[str]:
    """The Hydra overrides of `python -m train` for one parity run (no τ judge, no W&B: the parity judge
    decodes every head alike afterwards). The seed stays our default: it also picks our held-out split,
    which every parity run shares, so a recipe's own seed (speculators': 42) does not apply here."""
    args = [f"+model={model}", f"head={head}", f"store_dir={store}", f"output_dir={out_dir}",
            f"train.max_steps={recipe.steps}", f"train.batch_tokens={recipe.batch_tokens}", f"train.lr={recipe.lr}",
            f"train.schedule={recipe.schedule}", f"train.warmup_steps={recipe.warmup_steps}",
            f"train.min_lr_ratio={recipe.min_lr_ratio}", f"train.weight_decay={recipe.weight_decay}",
            f"train.optimizer={recipe.optimizer}",
            f"train.ttt_steps={recipe.ttt_steps}", f"train.ttt_decay={recipe.ttt_decay}",
            "train.decay_steps=null", "train.tau_every=0", "train.eval_every=0", "train.log_every=5",
            f"train.save_every={max(25, recipe.steps // 4)}", "train.progress=false", "wandb.mode=disabled"]
    if head == "eagle3":
        args += [f"train.draft_vocab={draft_vocab}", "train.noise=0.0", f"train.eagle3_norms={str(eagle3_norms).lower()}",
                 f"train.freeze_lm_head={str(recipe.freeze_lm_head).lower()}"]
    return args


def train_ours(head: str, store: Path, model: str, out_dir: Path, recipe: Recipe, draft_vocab: int | None,
               threads: int, eagle3_norms: bool = False, extra: tuple[str, ...] = ()) -> TrainerRun:
    """Train one head with our trainer in a child process limited to `threads`; its curves and speed.
    `extra`: more Hydra overrides, after the recipe's."""
    args = overrides(head, store, model, out_dir, recipe, draft_vocab, eagle3_norms) + list(extra)
    command = [sys.executable, "-m", "train", *args]
    out_dir.mkdir(parents=True, exist_ok=True)
    run_logged(command, out_dir / "train.log", child_env(threads), cwd=ROOT, append=True)
    name = f"ours-{head}" + ("-norms" if eagle3_norms else "")
    return run_of(name, out_dir, recipe, " ".join(command[1:]))


def run_of(name: str, out_dir: Path, recipe: Recipe, command: str) -> TrainerRun:
    """A finished run of ours, read back from its metrics.jsonl (train/tracking.py). Its loss is the one it
    minimises: EAGLE-3's token CE; EAGLE-1/2's feature loss + 0.1 x token CE (EAGLE's weights)."""
    rows = read_metrics(out_dir)

    def loss(row: dict) -> float:
        return row["train/token_loss"] if recipe.loss == "ce" else row["train/feature_loss"] + 0.1 * row["train/token_loss"]

    curve = [CurvePoint(step, loss(row), row.get("train/top1")) for step, row in sorted(rows.items())
             if "train/token_loss" in row]
    tokens = sum(row.get("train/pairs", 0.0) for row in rows.values())
    seconds = sum(row.get("train/seconds", 0.0) for row in rows.values())
    return TrainerRun(name, recipe, out_dir / "head", seconds, int(tokens), curve, command)
