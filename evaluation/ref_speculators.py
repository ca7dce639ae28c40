"""vLLM's `speculators` 0.9.0 trainer as one contestant of the parity comparison (evaluation/parity.py).

    data = write_data(store_dir, records, work / "data", final_norm_weight(target_dir))
    run = train(data, target_dir, work / "run", reference_recipe(steps, batch_tokens), draft_ids)  # TrainerRun

speculators runs from its own venv (`bash scripts/setup_consumers.sh speculators`), through
scripts/consumers/speculators_train.py, which adapts its trainer to a CPU (its docstring lists how)
and then calls `speculators train`'s own entry point.

The data, as speculators reads it (speculators/train/data.py ArrowDataset, hs_connectors FileTransfer,
data_generation/offline.py, cli/prepare_data.py):

- `DATA/` is a `datasets` dataset saved with `save_to_disk`, as `speculators prepare-data` writes it:
  one row per record, columns `input_ids` and `loss_mask` (int64 lists) and `seq_len`, torch format.
- `DATA/hidden_states/hs_{i}.safetensors` holds row i's features:
  `hidden_states [T, K+1, H]` (K aux layers, then the verifier's last layer) and `token_ids [T]`
  (int64; a row whose token_ids differ from input_ids is skipped by the reader). Its reader splits
  them into `hidden_states[:, :-1]` flattened to [T, K*H] (the draft's fc input) and
  `verifier_last_hidden_states = hidden_states[:, -1]`, from which the trainer makes its targets:
  `verifier_lm_head(verifier_norm(last))`, the target's logits over the draft vocabulary.

Our store (data_prep/store.py) has the K fused layers side by side (`aux_hidden_states [T, K*H]`, HF
`hidden_states[2], [15], [27]` for SmolLM2: the same numbers as speculators' `target_layer_ids`) and
the last layer *after* the final norm (`hidden_states [T, H]`, y = w * x / rms(x)). speculators wants
it *before* the norm, as vLLM captures it. We write x' = y / w (w: the target's `model.norm.weight`,
which must have no zero entry; SmolLM2's |w| >= 0.87). Then rms(x') = rms(x / rms(x)) = 1 (up to the norm's eps), so
speculators' `verifier_norm(x') = w * x' / rms(x') = y`: its targets are our store's targets. x' is
stored in bf16, as the store's y is and as speculators' collate casts it anyway; the round trip
verifier_norm(bf16(x')) vs y then differs by bf16 rounding (relative ~2^-8), not by the norm
(tests/test_parity_speculators.py checks both, in fp32).

Alignment: speculators' `shift_batch` (models/eagle3/data.py) pairs, per record, input_ids[1:],
aux[:-1], last[1:] and loss_mask[1:]: the draft reads the fused features at t and the token at t+1,
and learns the target's distribution at t+1 where loss_mask[t+1] is set. That is our `make_pairs`
(train/loss.py): features[:, :-1], next_ids = input_ids[:, 1:], target = hidden[:, 1:], mask =
loss_mask[:, 1:]. Rows are written in the order of `records`, records with no loss token included
(prepare-data would drop them; they cost tokens and add no loss in both trainers).

speculators insists on a validation split (`--train-data-ratio` must lie strictly between 0 and 1):
`write_data` appends one extra row, a copy of the first record, and `train` sets the ratio so that
all the given records are training rows and only that copy is held out.
"""

from __future__ import annotations

import json
import shlex
import shutil
import struct
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from data_prep.store import FeatureStore
from eagle.common.child_process import child_env, run_logged
from evaluation.parity_run import CurvePoint, Recipe, TrainerRun

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / Path(".consumers/speculators")
PYTHON = VENV / "bin" / "python"
LAUNCHER = ROOT / "scripts" / "consumers" / "speculators_train.py"
SETUP = "bash scripts/setup_consumers.sh speculators"
META = "parity_data.json"  # written last by write_data: marks a folder as ours (and complete)


def available() -> str | None:
    """None when the speculators venv is usable, else why not (one line)."""
    if not PYTHON.exists():
        return f"{VENV} missing: run `{SETUP}`"
    for package in ("speculators", "hs_connectors", "datasets"):
        if not any(VENV.glob(f"lib/python*/site-packages/{package}/__init__.py")):
            return f"{VENV} has no {package} package: run `{SETUP}`"
    if not LAUNCHER.exists():
        return f"{LAUNCHER} missing"
    return None


# --- data ---------------------------------------------------------------------------------------


def final_norm_weight(target_dir: str | Path) -> torch.Tensor:
    """The target's final norm weight (`model.norm.weight`) from its safetensors, as stored."""
    target_dir = Path(target_dir)
    index = target_dir / "model.safetensors.index.json"
    files = ([target_dir / json.loads(index.read_text())["weight_map"]["model.norm.weight"]] if index.exists()
             else sorted(target_dir.glob("*.safetensors")))
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            if "model.norm.weight" in f.keys():
                return f.get_tensor("model.norm.weight")
    raise KeyError(f"{target_dir}: no model.norm.weight in {[p.name for p in files]}")


def invert_final_norm(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x' = y / w in fp32: a pre-norm last layer whose RMSNorm with `weight` is `hidden` (y).

    ValueError when w has a zero: y is 0 there whatever x was, and a 0 in x' would lower rms(x')."""
    w = weight.float()
    if bool((w == 0).any()):
        raise ValueError(f"the final norm weight has {int((w == 0).sum())} zero entries: the layer before the norm "
                         "cannot be recovered from the store's post-norm features")
    return hidden.float() / w


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm (speculators' verifier_norm) in fp32: w * x / sqrt(mean(x^2) + eps)."""
    x = x.float()
    return weight.float() * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def hs_file(data_dir: Path, i: int) -> Path:
    return Path(data_dir) / "hidden_states" / f"hs_{i}.safetensors"


def write_data(store_dir: str | Path, records: list[int], out_dir: str | Path,
               final_norm_weight: torch.Tensor, *, arrow: bool | None = None) -> Path:
    """Write `records` (indices into the store) as speculators' training data in `out_dir` (see the
    module docstring) and return `out_dir`.

    Rows 0..N-1 are the records in the given order; row N is a copy of records[0], the validation
    row speculators requires. `rows.jsonl` keeps every row's input_ids and loss_mask; the Arrow
    dataset is made from it by the speculators venv (its `datasets`): now when `arrow` is True, or
    None and the venv is there; else by `train`. A folder this function wrote before is replaced.
    """
    if not records:
        raise ValueError("write_data: no records")
    store = FeatureStore(store_dir, require_complete=False)
    out = Path(out_dir)
    if out.exists():
        if (out / META).exists() or (out / "rows.jsonl").exists():
            shutil.rmtree(out)
        elif any(out.iterdir()):
            raise FileExistsError(f"{out}: not empty and not written by write_data")
    (out / "hidden_states").mkdir(parents=True, exist_ok=True)
    h = store.hidden_size
    weight = final_norm_weight.float()
    if weight.shape != (h,):
        raise ValueError(f"final norm weight {tuple(weight.shape)} != hidden size {h}")
    layers = list(store.manifest["target"].get("feature_layers") or [])
    rows = [*records, records[0]]
    aux_k = None
    with open(out / "rows.jsonl", "w") as sink:
        for i, r in enumerate(rows):
            rec = store[r]
            if rec.aux_hidden_states is None:
                raise ValueError(f"{store_dir}: record {r} has no aux_hidden_states (not an EAGLE-3 store)")
            t, width = rec.aux_hidden_states.shape
            if width % h:
                raise ValueError(f"{store_dir}: aux_hidden_states width {width} is not a multiple of {h}")
            aux_k = width // h
            dtype = rec.hidden_states.dtype
            last = invert_final_norm(rec.hidden_states, weight).to(dtype)
            states = torch.cat([rec.aux_hidden_states.reshape(t, aux_k, h), last[:, None]], dim=1)
            ids = rec.input_ids.to(torch.int64)
            save_file({"hidden_states": states.contiguous(), "token_ids": ids.contiguous()}, str(hs_file(out, i)))
            sink.write(json.dumps({"input_ids": ids.tolist(), "loss_mask": rec.loss_mask.to(torch.int64).tolist()})
                       + "\n")
    aux_layers = [x for x in layers if x != -1]
    meta = {
        "store": str(Path(store_dir).resolve()), "records": list(records), "rows": len(rows),
        "train_rows": len(records), "validation_row": {"index": len(records), "copy_of_record": records[0]},
        "hidden_size": h, "aux_layers": aux_layers if len(aux_layers) == aux_k else None, "aux_count": aux_k,
        "last_layer": "pre-norm x' = y / w (y: store hidden_states, post-norm; w: target model.norm.weight)",
    }
    if arrow or (arrow is None and available() is None):
        _write_arrow(out)
    (out / META).write_text(json.dumps(meta, indent=1))
    return out


def _write_arrow(data_dir: Path) -> None:
    _run([str(PYTHON), str(LAUNCHER), "--launcher-write-dataset", str(data_dir)], data_dir / "write_dataset.log",
         threads=1, cwd=data_dir)


def _has_arrow(data_dir: Path) -> bool:
    return (data_dir / "state.json").exists() and any(data_dir.glob("data-*.arrow"))


# --- recipe -------------------------------------------------------------------------------------


def reference_recipe(steps: int, batch_tokens: int) -> Recipe:
    """speculators 0.9.0's documented defaults (speculators/train/config/schema.py) for eagle3.

    lr 1e-3; linear schedule to 0 over the run (`scheduler_type linear`, total steps = max-steps);
    warmup 1% of the total steps (its default when neither warmup steps nor ratio is set);
    weight decay 0.01; 3 TTT steps, loss decay 1.0 (every step weighs alike); loss `kl_div`
    (forward KL to the target's distribution over the draft vocabulary); seed 42. Optimizer
    `muon`, its default, which runs on a CPU (torch.optim.Muon): Muon for the 2-D weights (fc,
    attention and MLP projections) at lr 1e-3 (`muon_lr` defaults to lr), momentum 0.95, weight
    decay 0.1 (`muon_weight_decay`), 5 Newton-Schulz steps, `match_rms_adamw` lr scaling; AdamW at
    lr 1e-3, weight decay 0.01 for the rest (norms). `weight_decay` here is AdamW's; Muon's 0.1 is
    left at speculators' default by `train`. Its loss is the sum over the TTT steps, each the mean
    over loss-masked positions. The batch is one packed row of `batch_tokens` (speculators'
    default `total_seq_len` is 8192). Its lm_head stays the verifier's rows of the draft vocabulary
    (only fc, the layer and the norms train), whatever the recipe: `freeze_lm_head`.
    """
    return Recipe("reference", steps, batch_tokens, lr=1e-3, schedule="linear", warmup_steps=steps // 100,
                  weight_decay=0.01, ttt_steps=3, ttt_decay=1.0, loss="kl_div", optimizer="muon", min_lr_ratio=0.0,
                  seed=42, freeze_lm_head=True)


SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant": "none"}
# Recipe "ce" is the soft cross-entropy against the target's distribution; its gradient is KL's (they
# differ by the target's entropy), so it runs as speculators' kl_div. speculators' own "ce" is the
# hard-label CE on the target's argmax: not the same loss.
LOSSES = {"kl_div": "kl_div", "ce": "kl_div"}


def recipe_flags(recipe: Recipe) -> list[str]:
    """The `speculators train` flags of a Recipe; ValueError for what speculators cannot run.

    speculators' schedules decay to 0; a recipe's min_lr_ratio > 0 is run by the launcher's
    `--launcher-min-lr-ratio` (its docstring, item 10). Warmup is transformers' (lr x step / warmup),
    ours is lr x (step + 1) / (warmup + 1): a code difference, kept."""
    if recipe.schedule not in SCHEDULES:
        raise ValueError(f"speculators has no {recipe.schedule!r} schedule (linear, cosine, constant)")
    if not 0.0 <= recipe.min_lr_ratio < 1.0:
        raise ValueError(f"min_lr_ratio {recipe.min_lr_ratio} is not in [0, 1)")
    if recipe.loss not in LOSSES:
        raise ValueError(f"speculators' eagle3 has no {recipe.loss!r} loss (kl_div, or ce run as kl_div)")
    if recipe.optimizer not in ("adamw", "muon"):
        raise ValueError(f"speculators has no {recipe.optimizer!r} optimizer (adamw, muon)")
    return ["--lr", repr(recipe.lr), "--weight-decay", repr(recipe.weight_decay), "--optimizer", recipe.optimizer,
            "--scheduler-type", SCHEDULES[recipe.schedule], "--scheduler-warmup-steps", str(recipe.warmup_steps),
            "--ttt-steps", str(recipe.ttt_steps), "--ttt-step-loss-decay", repr(recipe.ttt_decay),
            "--loss-fn", LOSSES[recipe.loss], "--max-steps", str(recipe.steps),
            "--total-seq-len", str(recipe.batch_tokens), "--seed", str(recipe.seed),
            *(["--launcher-min-lr-ratio", repr(recipe.min_lr_ratio)]
              if recipe.min_lr_ratio and recipe.schedule != "constant" else [])]


# --- draft vocabulary ---------------------------------------------------------------------------


def write_npy(path: Path, values: list, dtype: str) -> None:
    """A 1-D .npy file (format 1.0) of int64 ('<i8') or bool ('|b1') values, without numpy."""
    body = struct.pack(f"<{len(values)}q", *values) if dtype == "<i8" else bytes(1 if v else 0 for v in values)
    header = f"{{'descr': '{dtype}', 'fortran_order': False, 'shape': ({len(values)},), }}"
    pad = 64 - (10 + len(header) + 1) % 64
    header = header + " " * (pad % 64) + "\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1") + body)


def write_vocab(draft_ids: list[int], vocab_size: int, out_dir: Path) -> tuple[Path, Path] | None:
    """d2t/t2d .npy files of the draft vocabulary in speculators' convention (draft ids in ascending
    target-id order, d2t[i] = target_id - i, t2d[v] = v is drafted); None for the whole vocabulary."""
    ids = sorted(set(int(v) for v in draft_ids))
    if len(ids) != len(draft_ids):
        raise ValueError("draft_ids has repeated ids")
    if ids and (ids[0] < 0 or ids[-1] >= vocab_size):
        raise ValueError(f"draft_ids outside the target vocabulary [0, {vocab_size})")
    if len(ids) == vocab_size:
        return None
    d2t, t2d = out_dir / f"d2t-{len(ids)}.npy", out_dir / f"t2d-{len(ids)}.npy"
    write_npy(d2t, [v - i for i, v in enumerate(ids)], "<i8")
    member = [False] * vocab_size
    for v in ids:
        member[v] = True
    write_npy(t2d, member, "|b1")
    return d2t, t2d


# --- training -----------------------------------------------------------------------------------


def _run(command: list[str], log: Path, threads: int, cwd: Path) -> None:
    run_logged(command, log, child_env(threads, foreign=True, COLUMNS="200"), cwd=cwd)


def train_command(data_dir: Path, target_dir: Path, out_dir: Path, recipe: Recipe, vocab: tuple[Path, Path] | None,
                  aux_layers: list[int] | None, train_rows: int, has_tokenizer: bool) -> list[str]:
    """The launcher's argv: speculators' own flags (its eagle3 architecture defaults untouched)."""
    ratio = (train_rows + 0.5) / (train_rows + 1)  # int(rows * ratio) == train_rows: only the copy is held out
    args = [str(PYTHON), str(LAUNCHER),
            "--launcher-metrics", str(out_dir / "metrics.jsonl"), "--launcher-summary", str(out_dir / "summary.json"),
            "--speculator-type", "eagle3", "--verifier-name-or-path", str(target_dir),
            "--data-path", str(data_dir), "--save-path", str(out_dir / "checkpoints"),
            "--log-dir", str(out_dir / "logs"), "--run-name", "parity", "--log-freq", "1",
            "--train-data-ratio", repr(ratio), "--on-missing", "raise",
            "--draft-attn-impl", "sdpa", "--loss-implementation", "eager", "--num-workers", "0",
            "--full-attention-indices", "0", *recipe_flags(recipe)]
    if aux_layers:
        args += ["--target-layer-ids", *map(str, aux_layers)]
    if vocab is not None:
        args += ["--d2t-path", str(vocab[0]), "--t2d-path", str(vocab[1])]
    if not has_tokenizer:  # speculators resolves an eagle3-unused mask token from the tokenizer
        args += ["--mask-token-id", "0"]
    return args


def train(data_dir: str | Path, target_dir: str | Path, out_dir: str | Path, recipe: Recipe,
          draft_ids: list[int], threads: int = 2) -> TrainerRun:
    """Run `speculators train` on `data_dir` (from write_data) in its venv with `threads` threads.

    The draft vocabulary is `draft_ids` (target ids, any order; all of them = the whole vocabulary,
    no d2t/t2d). The architecture is speculators' eagle3 default (norm_before_fc, norm_before_residual,
    norm_output on; one llama layer; embedding and lm_head frozen at the target's), with layer 0 on
    full attention; `out_dir/summary.json` records what it built. `out_dir/checkpoints` is replaced.

    Returns the TrainerRun: `head_dir` = speculators' final checkpoint folder (`checkpoints/<last
    epoch>`: config.json with speculators_model_type eagle3, model.safetensors); `curve` = one point
    per optimizer step (step = 1-based count of steps done), `loss` = speculators' logged training
    loss (what it minimises: the sum over its TTT steps i of ttt_decay**i x step i's mean KL over the
    loss-masked positions; `loss_{i}` per step are in out_dir/metrics.jsonl), `top1` = `full_acc_0` (first TTT step: draft argmax == target
    argmax over the draft vocabulary, on loss-masked positions); `seconds` = wall time of its
    `train_epoch` calls (data loading included; model build, checkpoints and validation not);
    `tokens` = the positions of its packed rows that belong to a record, after its one-token shift
    (sum over records of length - 1), over all steps.
    """
    reason = available()
    if reason:
        raise RuntimeError(reason)
    data_dir, target_dir, out_dir = Path(data_dir).resolve(), Path(target_dir).resolve(), Path(out_dir).resolve()
    meta = json.loads((data_dir / META).read_text())
    if not _has_arrow(data_dir):
        _write_arrow(data_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out_dir / "checkpoints", ignore_errors=True)
    for stale in ("metrics.jsonl", "summary.json"):
        (out_dir / stale).unlink(missing_ok=True)
    config = json.loads((target_dir / "config.json").read_text())
    vocab_size = int(config.get("vocab_size") or config["text_config"]["vocab_size"])
    vocab = write_vocab(draft_ids, vocab_size, out_dir)
    has_tokenizer = any((target_dir / f).exists() for f in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"))
    command = train_command(data_dir, target_dir, out_dir, recipe, vocab, meta.get("aux_layers"), meta["train_rows"],
                            has_tokenizer)
    _run(command, out_dir / "train.log", threads=threads, cwd=out_dir)
    run = read_run(out_dir, recipe, shlex.join(command))
    run.save(out_dir / "trainer_run.json")
    return run


def read_run(out_dir: Path, recipe: Recipe, command: str = "") -> TrainerRun:
    """A finished run read back from the launcher's metrics.jsonl and summary.json."""
    summary = json.loads((out_dir / "summary.json").read_text())
    curve, tokens = [], 0
    for line in (out_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        record = row["record"]
        if row["hparams"] or "train" not in record:
            continue
        metrics = record["train"]
        curve.append(CurvePoint(int(record["global_step"]) + 1, float(metrics["loss"]), metrics.get("full_acc_0")))
        tokens += int((record.get("profile") or {}).get("num_tokens", 0))
    head = summary.get("final_checkpoint")
    if head is None:
        epochs = [p for p in (out_dir / "checkpoints").iterdir() if p.is_dir() and not p.is_symlink()
                  and p.name.isdigit()]
        if not epochs:
            raise FileNotFoundError(f"{out_dir / 'checkpoints'}: no checkpoint")
        head = str(max(epochs, key=lambda p: int(p.name)))
    if summary.get("steps") != recipe.steps:
        raise RuntimeError(f"speculators ran {summary.get('steps')} steps, not {recipe.steps} ({out_dir / 'summary.json'})")
    return TrainerRun("speculators", recipe, Path(head), float(summary.get("train_seconds", 0.0)), tokens, curve,
                      command)
