"""`speculators train` (speculators 0.9.0) on a machine without an accelerator, for the parity
comparison (evaluation/ref_speculators.py). Run by .consumers/speculators/bin/python:

    python scripts/consumers/speculators_train.py [--launcher-metrics M.jsonl] [--launcher-summary S.json] \
        --verifier-name-or-path TARGET --data-path DATA ... (any `speculators train` flags)
    python scripts/consumers/speculators_train.py --launcher-write-dataset DATA

The second form turns DATA/rows.jsonl (one {"input_ids": [...], "loss_mask": [...]} per line, written
by ref_speculators.write_data) into the Arrow dataset `speculators prepare-data` saves and `speculators
train --data-path` loads: columns input_ids, loss_mask (int64 lists) and seq_len (int64), torch format,
`Dataset.save_to_disk(DATA)`. The hidden states beside it (DATA/hidden_states/hs_{i}.safetensors) are
already in place.

The first form patches speculators' trainer in this process only (monkeypatching at import time; no
file of the installed package changes), then calls speculators' own entry point,
`speculators.train.cli.main(TrainConfig.resolve(argv))`, with the remaining flags unchanged.

What running on a CPU needs
---------------------------
Patched here (only when `torch.accelerator.is_available()` is False):

1. Device. `Trainer.setup_model` and `train_epoch`/`val_epoch` put the model and every batch on
   `get_local_rank()`, the integer 0, which torch reads as `cuda:0`. `speculators.train.trainer.
   get_local_rank` is replaced by one returning `torch.device("cpu")` (the trainer uses that value
   for nothing else when it is not distributed).
2. Autocast. `Trainer.__init__` sets `device_type` to the current accelerator's type and falls
   back to "cuda"; `torch.autocast("cuda")` on a machine without CUDA disables itself with a
   warning, and the bf16 batches then meet fp32 weights (dtype error in `fc`). After `__init__`,
   `device_type` is set to "cpu", so the forward runs under CPU bf16 autocast, as speculators
   intends on an accelerator (`--hidden-states-dtype bfloat16`, fp32 master weights).
3. Step timer. `_StepTimer.mark/now` call `torch.accelerator.synchronize()`, which raises
   "Cannot access accelerator device when none is available". It becomes a no-op when there is
   no accelerator (CPU work is synchronous: the timer's wall-clock marks stay exact).

Passed as flags by ref_speculators.train (no patch needed):

4. `--draft-attn-impl sdpa`: the default `simple_flex_attention` has no CPU backward.
5. `--loss-implementation eager`: the default fused losses need Triton.
6. `--num-workers 0`: speculators' workers use the `spawn` context (a fresh interpreter each, 12
   by default) for nothing but file reads; in-process loading suits 1-2 cores.
7. `--full-attention-indices 0`: otherwise every draft layer is a 2,048-token sliding-window layer.
8. `--on-missing raise`: the default `generate` asks a vLLM server for missing hidden states.

Also true on a CPU, left as speculators does it: `conditional_torch_compile` compiles the draft's
forward only when CUDA is available, so it runs eagerly here; the DataLoader's `pin_memory=True`
only warns; `torch.optim.Muon` (the default optimizer) runs on a CPU.

Not CPU-specific, fixed here because the parity run needs an exact step count:

9. `--max-steps` ends `train_epoch`, but `run_training` still loops over all `--epochs` (default
   20): each further epoch trains one more step (its first batch, then the max-steps check), saves
   a checkpoint and validates. When `--max-steps` is given without `--epochs` (and without
   `--config`), the launcher counts the batches of each epoch with speculators' own packing
   sampler (`MultipackDistributedBatchSamplerV2` over the train split's `seq_len`, same seed and
   `--total-seq-len`) and appends `--epochs N`, the fewest epochs that reach max-steps; the last
   of them then stops at exactly max-steps.

Added, for a recipe speculators has no flag for (the reference recipe never uses it):

10. `--launcher-min-lr-ratio R` (R > 0): the linear or cosine schedule decays to R x lr instead of
    0 (warmup unchanged): the trainer's `get_cosine_schedule_with_warmup` becomes transformers'
    `get_cosine_with_min_lr_schedule_with_warmup(min_lr_rate=R)` (lr x (R + (1 - R) x cosine
    factor)), its `get_linear_schedule_with_warmup` the same form with the linear factor.

Recorded for the caller (not behaviour changes):

- `--launcher-metrics M.jsonl`: speculators logs its metrics as dicts on the `speculators.metrics`
  logger, which has no file backend (only tensorboard/wandb/trackio/mlflow) and reaches stdout
  through a rich console handler that reformats and wraps them. A JSON-lines handler is attached to
  that logger after `setup_metric_logger`; each line is {"step", "hparams", "record"}: the per-step
  train metrics (`loss`, `loss_{i}`, `full_acc_{i}`, `cond_acc_{i}`, lr, profile), the validation
  metrics, and the resolved run config (`hparams: true`). `_StepTimer.profile` also records its
  `num_tokens` (positions of the packed row that belong to a record, after shift_batch).
- `--launcher-summary S.json`: wall time of each `train_epoch` call (data loading included; model
  build, checkpoint saving and validation not), steps, epochs, the final checkpoint folder,
  trainable parameter names, and the draft's architecture flags.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path


def write_dataset(data_dir: Path) -> None:
    """DATA/rows.jsonl -> the Arrow dataset speculators' prepare-data writes (see module docstring)."""
    from datasets import Dataset

    rows = [json.loads(line) for line in (data_dir / "rows.jsonl").read_text().splitlines() if line.strip()]
    columns = {
        "input_ids": [r["input_ids"] for r in rows],
        "loss_mask": [r["loss_mask"] for r in rows],
        "seq_len": [len(r["input_ids"]) for r in rows],
    }
    dataset = Dataset.from_dict(columns)
    dataset.set_format(type="torch")
    dataset.save_to_disk(str(data_dir))


class _JsonLines(logging.Handler):
    """One JSON line per mapping logged on `speculators.metrics` (before the console reformats it)."""

    def __init__(self, path: Path):
        super().__init__(logging.INFO)
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")

    def emit(self, record: logging.LogRecord) -> None:
        from collections.abc import Mapping

        if not isinstance(record.msg, Mapping):
            return
        line = {"step": getattr(record, "step", None), "hparams": bool(getattr(record, "hparams", False)),
                "time": time.time(), "record": record.msg}
        with open(self.path, "a") as f:
            f.write(json.dumps(line, default=_plain) + "\n")


def _plain(value):
    try:
        import torch

        if isinstance(value, torch.Tensor):
            return value.tolist()
        if isinstance(value, torch.dtype):
            return str(value)
    except ImportError:
        pass
    return str(value)


def _flag(argv: list[str], name: str) -> str | None:
    """The value of `--name VALUE` or `--name=VALUE` in argv (last one wins), else None."""
    found = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith(name + "="):
            found = arg.split("=", 1)[1]
    return found


def epochs_for(argv: list[str]) -> tuple[int, list[int]] | None:
    """(epochs, batches per epoch) that reach --max-steps with speculators' own packing sampler,
    or None when argv leaves the epoch count to the user (see item 9 of the module docstring)."""
    max_steps = _flag(argv, "--max-steps")
    if max_steps is None or _flag(argv, "--epochs") is not None or _flag(argv, "--config") is not None:
        return None
    from datasets import load_from_disk
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    data = load_from_disk(_flag(argv, "--data-path") or "./output")
    ratio = float(_flag(argv, "--train-data-ratio") or 0.9)
    lengths = list(data.with_format(None)["seq_len"])[: int(len(data) * ratio)]  # ArrowDataset's train split
    sampler = MultipackDistributedBatchSamplerV2(
        batch_max_length=int(_flag(argv, "--total-seq-len") or 8192), lengths=lengths, num_replicas=1, rank=0,
        seed=int(_flag(argv, "--seed") or 42))
    per_epoch, done = [], 0
    while done < int(max_steps):
        sampler.set_epoch(len(per_epoch))
        n = len(sampler)
        if n == 0:
            raise SystemExit("speculators_train: the train split packs into no batch")
        per_epoch.append(n)
        done += n
    return len(per_epoch), per_epoch


def install_cpu_patches() -> bool:
    """Items 1-3 of the module docstring; False (nothing patched) when an accelerator is present."""
    import torch

    if torch.accelerator.is_available():
        return False
    sync = torch.accelerator.synchronize

    def synchronize(*args, **kwargs):  # item 3
        if torch.accelerator.is_available():
            sync(*args, **kwargs)

    torch.accelerator.synchronize = synchronize

    import speculators.train.trainer as trainer

    trainer.get_local_rank = lambda: torch.device("cpu")  # item 1
    init = trainer.Trainer.__init__

    def trainer_init(self, *args, **kwargs):  # item 2
        init(self, *args, **kwargs)
        self.device_type = "cpu"

    trainer.Trainer.__init__ = trainer_init
    return True


def install_min_lr(ratio: float) -> None:
    """Item 10 of the module docstring."""
    from functools import partial

    import speculators.train.trainer as trainer
    from torch.optim.lr_scheduler import LambdaLR
    from transformers.optimization import get_cosine_with_min_lr_schedule_with_warmup

    def linear_to_min(optimizer, num_warmup_steps, num_training_steps, last_epoch=-1):
        def factor(step: int) -> float:
            if step < num_warmup_steps:
                return step / max(1, num_warmup_steps)
            left = max(0.0, (num_training_steps - step) / max(1, num_training_steps - num_warmup_steps))
            return ratio + (1.0 - ratio) * left

        return LambdaLR(optimizer, factor, last_epoch)

    trainer.get_cosine_schedule_with_warmup = partial(get_cosine_with_min_lr_schedule_with_warmup, min_lr_rate=ratio)
    trainer.get_linear_schedule_with_warmup = linear_to_min


def install_recording(summary: dict, metrics_path: Path | None) -> None:
    """What the caller reads back (module docstring, "Recorded"); wraps, never changes, the trainer."""
    import speculators.train.cli as cli
    import speculators.train.trainer as trainer

    init = trainer.Trainer.__init__

    def trainer_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        raw = getattr(self.model, "module", self.model)
        cfg = raw.config
        summary["trainable"] = sorted(n for n, p in raw.named_parameters() if p.requires_grad)
        summary["trainable_params"] = sum(p.numel() for p in raw.parameters() if p.requires_grad)
        arch = {k: getattr(cfg, k, None)
                for k in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output", "embed_requires_grad",
                          "draft_vocab_size", "eagle_aux_hidden_state_layer_ids")}
        tl = cfg.transformer_layer_config
        arch.update(num_hidden_layers=tl.num_hidden_layers, intermediate_size=tl.intermediate_size,
                    attn_implementation=getattr(tl, "_attn_implementation", None),
                    layer_types=list(getattr(tl, "layer_types", None) or []),
                    sliding_window=getattr(tl, "sliding_window", None))
        summary["architecture"] = arch
        summary["device_type"] = self.device_type
        summary["optimizers"] = [type(o).__name__ for o in self.optimizers]
        summary["schedulers"] = [type(s).__name__ for s in getattr(self, "schedulers", [])]

    trainer.Trainer.__init__ = trainer_init

    train_epoch = trainer.Trainer.train_epoch

    def timed_train_epoch(self, epoch, *args, **kwargs):
        start = time.perf_counter()
        out = train_epoch(self, epoch, *args, **kwargs)
        summary.setdefault("epoch_seconds", []).append(time.perf_counter() - start)
        summary["steps"] = self.global_step
        return out

    trainer.Trainer.train_epoch = timed_train_epoch

    save = trainer.Trainer.maybe_save_checkpoint

    def recorded_save(self, epoch, *args, **kwargs):
        out = save(self, epoch, *args, **kwargs)
        folder = self.checkpointer.path / str(epoch)
        if (folder / "model.safetensors").exists():
            summary["final_checkpoint"] = str(folder)
        return out

    trainer.Trainer.maybe_save_checkpoint = recorded_save

    profile = trainer._StepTimer.profile

    def profile_with_tokens(self, num_tokens):
        out = profile(self, num_tokens)
        if out is not None:
            out["num_tokens"] = num_tokens
        return out

    trainer._StepTimer.profile = profile_with_tokens

    if metrics_path is not None:
        setup = cli.setup_metric_logger

        def setup_metric_logger(*args, **kwargs):
            setup(*args, **kwargs)
            logging.getLogger("speculators.metrics").addHandler(_JsonLines(metrics_path))

        cli.setup_metric_logger = setup_metric_logger


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--launcher-metrics", type=Path)
    parser.add_argument("--launcher-summary", type=Path)
    parser.add_argument("--launcher-write-dataset", type=Path)
    parser.add_argument("--launcher-min-lr-ratio", type=float, default=0.0)
    ours, rest = parser.parse_known_args(argv)
    if ours.launcher_write_dataset is not None:
        write_dataset(ours.launcher_write_dataset)
        return

    summary: dict = {"argv": rest}
    epochs = epochs_for(rest)
    if epochs is not None:
        rest = [*rest, "--epochs", str(epochs[0])]
        summary["epochs"], summary["batches_per_epoch"] = epochs
    summary["cpu_patches"] = install_cpu_patches()
    install_recording(summary, ours.launcher_metrics)
    if ours.launcher_min_lr_ratio:
        install_min_lr(ours.launcher_min_lr_ratio)
        summary["min_lr_ratio"] = ours.launcher_min_lr_ratio

    from speculators.train.cli import main as train_main
    from speculators.train.config import TrainConfig

    start = time.perf_counter()
    try:
        train_main(TrainConfig.resolve(rest))
    finally:
        summary["process_seconds"] = time.perf_counter() - start
        summary["train_seconds"] = sum(summary.get("epoch_seconds", []))
        if ours.launcher_summary is not None:
            ours.launcher_summary.parent.mkdir(parents=True, exist_ok=True)
            ours.launcher_summary.write_text(json.dumps(summary, indent=1, default=_plain))


if __name__ == "__main__":
    main(sys.argv[1:])
