"""The EAGLE authors' EAGLE-1/2 trainer (`eagle-llm==1.2.1`, `eagle/train/main.py`) as one side of the
trainer parity comparison (evaluation/parity_run.py).

It runs in its own venv (`bash scripts/setup_consumers.sh eagle-llm`) through the launcher
scripts/consumers/eagle_llm_train.py, which lists every adaptation made to run it on a CPU.

    data = write_data(store_dir, list(range(64)), work / "data")       # our store -> its files
    run = train(data, target_dir, work / "out", reference_recipe(10, 4096), None, threads=1)
    run.head_dir                                                         # a head load_head reads

**Its data.** One `torch.save`d dict per conversation, `{input_ids [T] int64, hidden_state [T, H],
loss_mask [T] int64}`, as its generator `eagle/ge_data/ge_data_all_vicuna.py` writes them (there:
fp16 `hidden_states[-1]` of the target, which in HF is after the final norm, like our store's
`hidden_states`). Its dataset pairs position t as (hidden[t], input_ids[t+1]) -> hidden[t+1]
(zeros after the last) and scores pair t where `loss_mask[t]` is 1 (the last forced to 0). Our
`make_pairs` (train/loss.py) makes the same pairs but scores pair t where our `loss_mask[t+1]` is
1, so the file's mask is ours shifted left by one: `loss_mask_file[t] = loss_mask[t+1]`; both
trainers then learn exactly the same pairs. Its own generator marks assistant tokens t with 1,
so on its own data it scores the pair whose *input* token is an assistant token, one earlier
than we do.

**Its recipe** (`reference_recipe`): its `train_config` and argparse defaults — AdamW lr 3e-5,
betas (0.9, 0.95), weight decay 0.01 (torch's default: it passes none), bs 4 conversations padded to
the longest, linear warmup over 2000 steps then linear decay to 0 at 800,000 steps (HF's
`get_linear_schedule_with_warmup`, stepped once per optimizer step), grad clipping by value at
0.5, loss v_w·SmoothL1(features) + p_w·soft cross-entropy (v_w 1.0, p_w 0.1) over the loss-masked
pairs, uniform feature noise of width 0.2·512/T on the input features, bf16 autocast
(`Accelerator(mixed_precision='bf16')`), full vocabulary, 20 epochs, max_len 2048.

**Its head**: a `Model` of fc (2H -> H, with bias) over [embedding | feature], one Llama layer
without input norm, rotary base 10000 whatever the target's (hard-coded). Its state dict uses our
key names already (`fc.*`, `layers.0.*`) plus the target's `embed_tokens.weight`, which is dropped.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from data_prep.store import FeatureStore
from eagle.heads.checkpoint import head_from_state, load_head, save_head
from eagle.heads.eagle2 import DraftConfig
from eagle.common.child_process import child_env, run_logged
from evaluation.parity_run import CurvePoint, Recipe, TrainerRun

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".consumers" / "eagle-llm"
PYTHON = VENV / "bin" / "python"
LAUNCHER = ROOT / "scripts" / "consumers" / "eagle_llm_train.py"
SETUP = "bash scripts/setup_consumers.sh eagle-llm"
TRAINER = "eagle-llm"

RECORDS = "records"  # the folder its trainer reads (--tmpdir)
HELDOUT = "heldout"  # subfolder of links that fill its 5 % test split
META = "meta.json"
MAX_LEN = 2048  # its train_config["max_len"]: longer conversations are cut
BS = 4  # its --bs default
DECAY_STEPS = 800_000  # its train_config["total_steps"]: the end of the linear decay
ROPE_THETA = 10000.0  # its LlamaRotaryEmbedding's base, hard-coded
DROPPED_KEYS = ("embed_tokens.weight",)  # the target's, frozen in its Model


def available() -> str | None:
    """None when the venv is usable, else why not."""
    if not PYTHON.exists():
        return f"{VENV} missing: run `{SETUP}`"
    if not (VENV / ".installed").exists():
        return f"{VENV} is incomplete (no .installed stamp): run `{SETUP}`"
    if not any(VENV.glob("lib/python*/site-packages/eagle/train/main.py")):
        return f"{VENV} has no eagle-llm package: run `{SETUP}`"
    return None


# ---------------------------------------------------------------- data

def heldout_links(n: int) -> int:
    """How many extra files make its 95 % train split exactly the first n (its split: int(len * 0.95))."""
    if n < 1:
        raise ValueError("no records to write")
    k = 1
    while int((n + k) * 0.95) < n:
        k += 1
    if int((n + k) * 0.95) != n:  # cannot happen: the interval [n/0.95, (n+1)/0.95) is longer than 1
        raise AssertionError(n)
    return k


def record_file(i: int) -> str:
    return f"data_{i}.ckpt"  # its generator's naming: data_{index}.ckpt


def conversation(input_ids: torch.Tensor, loss_mask: torch.Tensor, hidden: torch.Tensor,
                 dtype: torch.dtype = torch.float16) -> dict:
    """One of our records as its trainer's file content; the mask shifted so that it scores our pairs."""
    mask = loss_mask.long()
    shifted = torch.cat([mask[1:], mask.new_zeros(1)])  # file[t] = ours[t+1]: pair t (x_{t+1} -> f_{t+1})
    return {"input_ids": input_ids.long().clone(), "hidden_state": hidden.to(dtype).clone(), "loss_mask": shifted}


def write_data(store_dir: str | Path, records: list[int], out_dir: str | Path,
               dtype: torch.dtype = torch.float16) -> Path:
    """Write `records` of our feature store as its trainer's input; return `out_dir` (give it to `train`).

    `out_dir/records/data_{i}.ckpt` per store record i (the folder its `--tmpdir` reads),
    `out_dir/records/heldout/`: hard links to the first file that fill its 5 % test split (never
    trained on), `out_dir/meta.json`: the records, their lengths, tokens and scored pairs.
    `dtype`: of `hidden_state`, fp16 as its generator writes (a bf16 store converts exactly
    unless a feature exceeds fp16's range, then that file is fp32)."""
    store = FeatureStore(store_dir, require_complete=False)
    out = Path(out_dir)
    data = out / RECORDS
    if data.exists():
        shutil.rmtree(data)
    (data / HELDOUT).mkdir(parents=True)
    lengths, pairs, wide, cut = [], 0, [], []
    for i in records:
        rec = store[i]
        item = conversation(rec.input_ids, rec.loss_mask, rec.hidden_states, dtype)
        if not torch.isfinite(item["hidden_state"]).all():
            item["hidden_state"] = rec.hidden_states.float().clone()
            wide.append(i)
        n = len(item["input_ids"])
        if n > MAX_LEN:
            cut.append(i)
        lengths.append(min(n, MAX_LEN))
        pairs += int(item["loss_mask"][:MAX_LEN][:-1].sum())  # its dataset zeroes the last position
        torch.save(item, data / record_file(i))
    first = data / record_file(records[0])
    for j in range(heldout_links(len(records))):
        link = data / HELDOUT / f"data_heldout{j}.ckpt"
        try:
            os.link(first, link)
        except OSError:
            shutil.copy(first, link)
    meta = {"store": str(Path(store_dir).resolve()), "records": list(records), "lengths": lengths,
            "tokens": sum(lengths), "scored_pairs": pairs, "dtype": str(dtype).replace("torch.", ""),
            "fp32_records": wide, "truncated_records": cut, "hidden_size": store.hidden_size,
            "heldout_links": heldout_links(len(records))}
    (out / META).write_text(json.dumps(meta, indent=1))
    return out


# ---------------------------------------------------------------- recipe

def reference_recipe(steps: int, batch_tokens: int) -> Recipe:
    """Its documented defaults (see the module docstring); `batch_tokens` is what the caller budgets
    per step: `train` turns it into conversations per batch (its own default is 4)."""
    return Recipe(name="reference", steps=steps, batch_tokens=batch_tokens, lr=3e-5, schedule="linear",
                  warmup_steps=2000, weight_decay=0.01, ttt_steps=1, ttt_decay=1.0, loss="feature+ce",
                  optimizer="adamw", min_lr_ratio=0.0, seed=0)


def decay_horizon(recipe: Recipe, decay_steps: int | None = None) -> int:
    """Where the schedule's decay ends: `decay_steps` when given; for its own recipe ("reference") its
    `total_steps` (800,000); for any other recipe the end of the run, as our trainer runs a parity
    recipe (`train.decay_steps=null`, evaluation/parity_ours.py)."""
    if decay_steps is not None:
        return decay_steps
    return DECAY_STEPS if recipe.name == "reference" else recipe.steps


def batch_rows(batch_tokens: int, lengths: list[int]) -> int:
    """Conversations per batch: as many of the longest as fit in `batch_tokens` (at least 1)."""
    return max(1, batch_tokens // max(lengths))


# ---------------------------------------------------------------- its checkpoint -> our head

def head_config(econfig: dict, fc_bias: bool, target: str = "") -> DraftConfig:
    """Our DraftConfig of a head its trainer made from `econfig` (the config json it trained with)."""
    heads = econfig["num_attention_heads"]
    return DraftConfig(
        hidden_size=econfig["hidden_size"], intermediate_size=econfig["intermediate_size"],
        num_attention_heads=heads, num_key_value_heads=econfig.get("num_key_value_heads") or heads,
        vocab_size=econfig["vocab_size"], head_dim=econfig["hidden_size"] // heads,
        rms_norm_eps=econfig.get("rms_norm_eps", 1e-6), rope_theta=ROPE_THETA, rope_scaling=None,
        max_position_embeddings=econfig.get("max_position_embeddings", 2048),
        hidden_act=econfig.get("hidden_act", "silu"), num_hidden_layers=econfig.get("num_hidden_layers", 1),
        fc_bias=fc_bias, target=target, feature_layers=[-1], architecture="eagle2",
    )


def map_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Its Model's state dict under our key names: they are the same (`fc.*`, `layers.N.*`), less the
    target's embedding. Anything else is an error rather than silently lost."""
    out = {k: v for k, v in state.items() if k not in DROPPED_KEYS}
    unknown = [k for k in out if not (k.startswith("fc.") or k.startswith("layers."))]
    if unknown:
        raise ValueError(f"keys of its checkpoint with no place in our head: {unknown}")
    return out


def convert(state_dir: str | Path, head_dir: str | Path, target: str = "",
            dtype: torch.dtype = torch.float32) -> Path:
    """Its final checkpoint (`state_dir/pytorch_model.bin` + the `config.json` it trained with) as our
    head folder; `dtype` of the saved weights (fp32: its master weights, unrounded)."""
    state_dir = Path(state_dir)
    state = torch.load(state_dir / "pytorch_model.bin", map_location="cpu", weights_only=True)
    econfig = json.loads((state_dir / "config.json").read_text())
    ours = map_state(state)
    cfg = head_config(econfig, fc_bias="fc.bias" in ours, target=target)
    return save_head(head_dir, head_from_state(ours, cfg), dtype=dtype)


def target_embedding(target_dir: str | Path) -> torch.Tensor:
    """The target's `model.embed_tokens.weight` [V, H] (one safetensors file or an index)."""
    target_dir = Path(target_dir)
    index = target_dir / "model.safetensors.index.json"
    name = "model.embed_tokens.weight"
    file = json.loads(index.read_text())["weight_map"][name] if index.exists() else "model.safetensors"
    with safe_open(str(target_dir / file), framework="pt") as f:
        return f.get_tensor(name)


@torch.no_grad()
def check_against_module(head_dir: str | Path, target_dir: str | Path, check_file: str | Path) -> float:
    """Largest |ours - its| of the converted head's features over the conversation the launcher ran its
    trained module on (fp32 both), relative to the output's largest magnitude."""
    ref = load_file(str(check_file))
    head = load_head(head_dir, dtype=torch.float32)
    emb = target_embedding(target_dir).float()
    t = ref["hidden"].shape[0]
    ours, _ = head(ref["hidden"][None], emb[ref["next_ids"]][None], torch.arange(t)[None])
    return float((ours[0] - ref["output"]).abs().max() / ref["output"].abs().max().clamp_min(1e-12))


# ---------------------------------------------------------------- running it

def read_curve(log_file: str | Path) -> list[CurvePoint]:
    """The per-step `wandb.log` dicts the launcher captured: loss = train/loss, top1 = train/acc."""
    curve = []
    for line in Path(log_file).read_text().splitlines():
        rec = json.loads(line)
        if "train/loss" in rec:
            curve.append(CurvePoint(step=int(rec["step"]), loss=float(rec["train/loss"]),
                                    top1=float(rec["train/acc"]) if "train/acc" in rec else None))
    return curve


def launcher_args(data_dir: Path, target_dir: Path, run_dir: Path, recipe: Recipe, bs: int,
                  decay_steps: int, num_workers: int | None, check: bool) -> list[str]:
    args = [str(PYTHON), str(LAUNCHER), "--target", str(target_dir), "--data", str(data_dir / RECORDS),
            "--out", str(run_dir), "--steps", str(recipe.steps), "--lr", repr(recipe.lr), "--bs", str(bs),
            "--warmup-steps", str(recipe.warmup_steps), "--decay-steps", str(decay_steps),
            "--schedule", recipe.schedule, "--min-lr-ratio", repr(recipe.min_lr_ratio),
            "--weight-decay", repr(recipe.weight_decay), "--seed", str(recipe.seed)]
    if num_workers is not None:
        args += ["--num-workers", str(num_workers)]
    return args + (["--check"] if check else [])


def train(data_dir: str | Path, target_dir: str | Path, out_dir: str | Path, recipe: Recipe,
          draft_ids: list[int] | None, threads: int = 2, *, bs: int | None = None,
          decay_steps: int | None = None, num_workers: int | None = None, check: bool = True,
          tolerance: float = 1e-3, timeout: float | None = None) -> TrainerRun:
    """Train with its trainer on `data_dir` (from `write_data`) for `recipe.steps` optimizer steps.

    `out_dir/run/`: its log (`launcher.log`), the captured W&B records (`wandb_log.jsonl`), its final
    state (`state_final/`), `summary.json`; `out_dir/head/`: that state as our head (fp32);
    `out_dir/trainer_run.json`. `bs` (conversations per batch) defaults to as many of the longest
    conversation as fit in `recipe.batch_tokens`. `decay_steps`: where the schedule's decay ends
    (default: `decay_horizon`: its 800,000 for its own recipe, else the run's end). `draft_ids` is
    ignored: EAGLE-1/2 drafts over the whole vocabulary and its trainer has no vocabulary option.
    `num_workers`: its DataLoader workers (None: its 2). `check`: compare the converted head with
    its trained module on one conversation; a relative difference above `tolerance` is an error."""
    reason = available()
    if reason:
        raise RuntimeError(reason)
    if recipe.ttt_steps != 1 or recipe.loss != "feature+ce" or recipe.optimizer != "adamw":
        raise ValueError(f"{TRAINER} trains plain EAGLE (ttt_steps 1, loss feature+ce, adamw); recipe has "
                         f"ttt_steps={recipe.ttt_steps}, loss={recipe.loss!r}, optimizer={recipe.optimizer!r}")
    del draft_ids  # full vocabulary, as EAGLE-1/2
    data_dir, target_dir, out = Path(data_dir).resolve(), Path(target_dir).resolve(), Path(out_dir).resolve()
    meta = json.loads((data_dir / META).read_text())
    bs = bs or batch_rows(recipe.batch_tokens, meta["lengths"])
    run_dir = out / "run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    args = launcher_args(data_dir, target_dir, run_dir, recipe, bs, decay_horizon(recipe, decay_steps),
                         num_workers, check)
    env = child_env(threads, foreign=True, WANDB_MODE="disabled")
    run_logged(args, run_dir / "launcher.log", env, cwd=run_dir, timeout=timeout)
    summary = json.loads((run_dir / "summary.json").read_text())
    head_dir = convert(run_dir / "state_final", out / "head", target=str(target_dir))
    if check:
        diff = check_against_module(head_dir, target_dir, run_dir / "check.safetensors")
        (out / "check.json").write_text(json.dumps({"max_relative_difference": diff, "tolerance": tolerance}))
        if not diff <= tolerance:
            raise RuntimeError(f"the converted head differs from {TRAINER}'s trained module by {diff:.2e} "
                               f"(relative) on one conversation: the key mapping or the config is wrong")
    result = TrainerRun(trainer=TRAINER, recipe=recipe, head_dir=head_dir, seconds=float(summary["seconds"]),
                        tokens=int(summary["tokens"]), curve=read_curve(run_dir / "wandb_log.jsonl"),
                        command=f"OMP_NUM_THREADS={threads} {shlex.join(args)}")
    result.save(out / "trainer_run.json")
    return result
