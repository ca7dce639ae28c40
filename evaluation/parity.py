"""`python -m evaluation.parity`: our trainer against the reference trainers, same data, same steps, same judge.

    python -m evaluation.parity --store STORE --epochs 1 --out results/parity \\
        --runs ours-eagle3@ours,speculators@ref,ours-eagle2@ours,eagle-llm@ref

STORE is one of our EAGLE-3 feature stores (`python -m data_prep +model=NAME head=eagle3`): it holds the
fused layers and the last layer, so it feeds EAGLE-3 and EAGLE-1/2 heads alike. Every run trains on
the same records (the store minus our trainer's held-out split), for the same number of optimizer
steps (our batch plan's steps per epoch x epochs, or --steps), over the same draft vocabulary (the
--draft-vocab most frequent training tokens), with the same threads. A run is `TRAINER@RECIPE`:

- trainers: `ours-eagle3`, `ours-eagle3-norms` (ours, with speculators' EAGLE-3 layer variant),
  `ours-eagle2`, `speculators` (speculators 0.9.0, EAGLE-3), `eagle-llm` (the EAGLE authors' EAGLE-1/2
  trainer, PyPI eagle-llm 1.2.1). The reference trainers run from their own venvs
  (`make consumers`), through launchers that adapt only device handling (scripts/consumers/).
- recipes: `ours` (our shipped recipe for the head type, evaluation/parity_ours.py) or `ref` (the
  reference trainer's documented defaults for that head type), so recipe and code can be told apart;
  `ref:optimizer=adamw+lr=3e-4` changes fields of it (evaluation/parity_run.py's Recipe).

Each run is judged by evaluation/parity_judge.py (our decoder: chain of 3 and the EAGLE-2 tree; vLLM's
counters when installed; `--no-ours` judges with vLLM's alone). Output in --out: `runs/NAME/run.json`
(curves, seconds, tokens), `scores.json`, `results.md` (the table), `curves.png`. A rerun skips
finished runs and judged heads, and our trainer resumes a run from its checkpoints.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from data_prep.store import FeatureStore
from eagle.heads.draft_vocab import ranked_ids
from evaluation.parity_ours import ours_recipe, train_ours
from evaluation.parity_run import Recipe, TrainerRun
from train.data import BatchPlan, split_indices
from train.vocab_choice import token_counts

log = logging.getLogger("parity")
REFERENCES = {"speculators": "evaluation.ref_speculators", "eagle-llm": "evaluation.ref_eagle_llm"}
HEAD_OF = {"ours-eagle3": "eagle3", "ours-eagle3-norms": "eagle3", "speculators": "eagle3", "ours-eagle2": "eagle2",
           "eagle-llm": "eagle2"}
REFERENCE_OF_HEAD = {"eagle3": "speculators", "eagle2": "eagle-llm"}  # whose defaults `@ref` means


@dataclass
class ParityData:
    """What every run shares: the store, its training records and draft vocabulary, the step count."""

    store: Path
    train_idx: list[int]
    draft_ids: list[int]  # target ids, most frequent first
    steps: int
    batch_tokens: int
    target_dir: Path

    @classmethod
    def of(cls, store: Path, draft_vocab: int, batch_tokens: int, epochs: float, steps: int | None,
           seed: int = 0, eval_fraction: float = 0.05) -> "ParityData":
        records = FeatureStore(store)
        train_idx, _ = split_indices(records.lengths(), eval_fraction, seed)  # our trainer's split, same seed
        vocab = int(records.manifest["target"]["vocab_size"])
        counts = token_counts(records, train_idx, vocab)
        ids = ranked_ids(counts, min(draft_vocab, vocab), seen_only=False)
        if steps is None:
            per_epoch = BatchPlan(train_idx, records.lengths(), batch_tokens, seed, 0, 1).per_epoch
            steps = max(1, round(per_epoch * epochs))
        target = records.manifest["target"]
        target_dir = Path(target.get("resolved_path") or target["path"])
        return cls(store, train_idx, ids.tolist(), steps, batch_tokens, target_dir)


def recipe_for(trainer: str, recipe: str, data: ParityData) -> Recipe:
    """`recipe`: `ours` or `ref`, optionally with changed fields: `ref:optimizer=adamw+lr=3e-4`."""
    name, _, changes = recipe.partition(":")
    head = HEAD_OF[trainer]
    if name == "ours":
        base = ours_recipe(head, data.steps, data.batch_tokens)
    elif name == "ref":
        base = reference(REFERENCE_OF_HEAD[head]).reference_recipe(data.steps, data.batch_tokens)
    else:
        raise ValueError(f"recipe {recipe!r}: choose ours or ref")
    return base.changed(changes.split("+")) if changes else base


def reference(trainer: str):
    """The adapter module of a reference trainer (evaluation/ref_*.py)."""
    return importlib.import_module(REFERENCES[trainer])


def train_run(spec: str, data: ParityData, model: str, out: Path, threads: int, extra: tuple[str, ...] = ()
              ) -> TrainerRun:
    """Train (or read back) the run `TRAINER@RECIPE`; `extra`: more overrides of our trainer (--set)."""
    trainer, _, recipe_name = spec.partition("@")
    if trainer not in HEAD_OF:
        raise ValueError(f"run {spec!r}: trainers are {', '.join(HEAD_OF)}")
    run_dir = out / "runs" / spec.replace("@", "-").replace(":", "-").replace("+", "-").replace("=", "-")
    done = run_dir / "run.json"
    if done.exists():
        return TrainerRun.from_json(json.loads(done.read_text()))
    recipe = recipe_for(trainer, recipe_name or "ours", data)
    log.info("training %s: %d steps, recipe %s", spec, recipe.steps, recipe)
    if trainer.startswith("ours-"):
        run = train_ours(HEAD_OF[trainer], data.store, model, run_dir, recipe, len(data.draft_ids), threads,
                         eagle3_norms=trainer.endswith("-norms"), extra=extra)
    else:
        run = reference_run(trainer, data, run_dir, recipe, threads, out)
    run.trainer = spec
    done.parent.mkdir(parents=True, exist_ok=True)
    run.save(done)
    return run


def reference_run(trainer: str, data: ParityData, run_dir: Path, recipe: Recipe, threads: int, out: Path
                  ) -> TrainerRun:
    """A reference trainer on the parity records, written once in its own input format under out/data."""
    ref = reference(trainer)
    reason = ref.available()
    if reason:
        raise RuntimeError(f"{trainer}: {reason}")
    data_dir = out / "data" / trainer
    if not (data_dir / ".complete").exists():
        if trainer == "speculators":
            ref.write_data(data.store, data.train_idx, data_dir, ref.final_norm_weight(data.target_dir))
        else:
            ref.write_data(data.store, data.train_idx, data_dir)
        (data_dir / ".complete").touch()
    draft_ids = data.draft_ids if HEAD_OF[trainer] == "eagle3" else None
    return ref.train(data_dir, data.target_dir, run_dir, recipe, draft_ids, threads)


def judge_runs(runs: list[TrainerRun], data: ParityData, args, out: Path) -> dict[str, dict]:
    """Scores of every run's head, cached in out/scores.json (keyed by run and judge settings)."""
    from evaluation.parity_judge import ParityJudge, cached_scores

    def make_judge() -> ParityJudge:
        torch.set_num_threads(args.threads)
        return ParityJudge(data.target_dir, args.prompts, args.num_prompts, args.max_new_tokens,
                           getattr(torch, args.dtype), vllm=not args.no_vllm, ours=not args.no_ours)

    return cached_scores(out / "scores.json", {r.trainer: r.head_dir for r in runs}, judges_key(args), make_judge)


def judges_key(args) -> str:
    """The cache key of this command's scores (evaluation/parity_judge.py's scores_key, as acceptance's)."""
    from evaluation.parity_judge import scores_key

    return scores_key(args.prompts, args.num_prompts, args.max_new_tokens, args.dtype, not args.no_vllm, not args.no_ours)


def parse_args(argv: list[str] | None):
    ap = argparse.ArgumentParser(prog="python -m evaluation.parity", description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True, help="an EAGLE-3 feature store (data_prep head=eagle3)")
    ap.add_argument("--model", default="smollm2_135m", help="our preset of the store's target (conf/model/)")
    ap.add_argument("--runs", default="ours-eagle3@ours,speculators@ref,ours-eagle2@ours,eagle-llm@ref",
                    help="comma-separated TRAINER@RECIPE (recipes: ours, ref)")
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps (overrides --epochs)")
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of every trainer and of the judge")
    ap.add_argument("--prompts", default="mtbench")
    ap.add_argument("--num-prompts", type=int, default=80)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--no-vllm", action="store_true", help="judge with our decoder only")
    ap.add_argument("--no-ours", action="store_true",
                    help="judge with vLLM's counters only (our eager chain and tree judge is ~10x slower)")
    ap.add_argument("--no-judge", action="store_true", help="train only")
    ap.add_argument("--out", type=Path, default=Path("results/parity"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="one more override of our trainer's runs (e.g. model.path=DIR for a target not in a preset)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    args = parse_args(argv)
    if args.no_vllm and args.no_ours:
        raise SystemExit("error: --no-vllm and --no-ours leave no judge (--no-judge trains only)")
    from evaluation.parity_report import write_report

    data = ParityData.of(args.store, args.draft_vocab, args.batch_tokens, args.epochs, args.steps)
    log.info("parity data: %d training records of %s, %d steps of %d tokens, draft vocabulary %d",
             len(data.train_idx), args.store, data.steps, data.batch_tokens, len(data.draft_ids))
    args.out.mkdir(parents=True, exist_ok=True)
    runs = [train_run(spec.strip(), data, args.model, args.out, args.threads, tuple(args.set))
            for spec in args.runs.split(",")]
    scores = {} if args.no_judge else judge_runs(runs, data, args, args.out)
    print(write_report(runs, scores, data, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
