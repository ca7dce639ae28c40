"""Run the EAGLE authors' EAGLE-1/2 trainer (`eagle/train/main.py` of `eagle-llm==1.2.1`) on this CPU.

Run by the python of `.consumers/eagle-llm` (`bash scripts/setup_consumers.sh eagle-llm`), normally
through `evaluation/ref_eagle_llm.py`:

    .consumers/eagle-llm/bin/python scripts/consumers/eagle_llm_train.py --target TARGET_DIR \
        --data DATA_DIR/records --out OUT_DIR --steps 10 [--lr 3e-5 --bs 4 --warmup-steps 2000 ...]

`--data` is a folder written by `evaluation.ref_eagle_llm.write_data`: one `torch.save`d dict per
conversation, as the package's own data generator (`eagle/ge_data/ge_data_all_*.py`) writes them.

The package's `main.py` is a script: argument parsing, data, model and the training loop all run at
module level, for 20 epochs, on CUDA, logging to W&B. This launcher leaves its code untouched (nothing
in site-packages is edited) and runs it with `runpy` as `python -m eagle.train.main` would, after
these adaptations, each made from outside the script:

1. Its weights are looked up through `model.safetensors.index.json` (else `pytorch_model.bin.index.json`)
   only, for `model.embed_tokens.weight` and `lm_head.weight`. `--basepath` is therefore a folder under
   `OUT/work/base` holding symlinks to the target's files plus an index we write; a target with tied
   embeddings (SmolLM2) has no `lm_head.weight`, so the folder also gets `lm_head.safetensors` holding
   a copy of the embedding under that name (what a tied target's lm_head is).
2. `--configpath` is a config json we write from the target's `config.json` with
   `num_hidden_layers: 1` (the head's one decoder layer, as in the authors' example configs) and no
   `rope_scaling`. Its rotary embedding hard-codes base 10000 whatever the target uses (SmolLM2:
   100000); the exported head therefore says `rope_theta: 10000` (done by ref_eagle_llm).
3. `wandb` is replaced by a stub module before the script imports it: no network, no account.
   `wandb.init`'s config (the script's `train_config`) and every dict passed to `wandb.log` go to
   `OUT/wandb_log.jsonl`, each with the optimizer step it follows (the script logs a step only when
   its batch has a loss-masked position).
4. `torch.Tensor.cuda` and `nn.Module.cuda` return the object itself (CPU). The script only calls
   them at the end of an epoch, which (5.) never comes, but a stray call cannot fail.
5. Stopping after `--steps` optimizer steps: the script has no max-steps option. The training loop
   iterates `tqdm(train_loader)`; `tqdm` is replaced by a pass-through that, for the train loader,
   yields batches until `--steps` have been taken and then raises a private exception that ends the
   script. When the loader runs out first, it is iterated again (a new shuffle, as the next epoch
   would), so the end-of-epoch code never runs: no end-of-epoch W&B sums, no test pass (its `getkacc`
   runs the head once per position of each test conversation, hours on a CPU) and no `save_state`
   (which, as written, saves after every epoch whose number is *not* a multiple of `save_freq`).
   The wall time of the loop runs from the first batch request to the stop (data loading included,
   model loading not); tokens are counted per batch (`attention_mask` ones, and padded positions).
6. The final checkpoint: the model that `Accelerator.prepare` returned is saved as
   `OUT/state_final/pytorch_model.bin` (its full `state_dict`, the file `accelerator.save_state` would
   write for it; optimizer and scheduler states are not saved).
7. The schedule: `transformers.get_linear_schedule_with_warmup` (what the script builds, with
   `num_warmup_steps` 2000 and `total_steps` 800000 from its `train_config`) is replaced by one with
   `--warmup-steps`, `--decay-steps` (the end of the decay), `--schedule` linear|cosine|constant and
   `--min-lr-ratio`; with the defaults (2000, 800000, linear, 0) it is the script's own schedule:
   HF's multiplier s/warmup during warmup (0 at the first step), then a linear decay.
8. `torch.optim.AdamW` gets `--weight-decay` (the script passes none, so torch's 0.01 applies;
   `--weight-decay` defaults to 0.01). Its lr (`--lr`) and betas (0.9, 0.95) are the script's.
9. `accelerate.utils.set_seed(0)` uses `--seed` instead of 0 (default 0).
10. The script splits its data files 95/5 into train and test in `os.walk` order. `write_data`
   puts every conversation in the data folder itself and a few hard links in a subfolder (walked
   after the folder's own files), sized so that the train split is exactly the conversations; this
   launcher checks that before the first step.
11. `--num-workers` (optional) replaces the DataLoader's `num_workers` (the script's is 2).
12. Mixed precision is the script's: `Accelerator(mixed_precision='bf16')`, which on a CPU runs the
   head's and the lm_head's forwards under `torch.autocast("cpu", bfloat16)`.
13. Its package is named `eagle`, like this project's: `sys.path` entries outside site-packages that
   hold an `eagle` package are dropped before it is imported, so a checkout never shadows it.
   Torch's warnings about `use_reentrant` (its gradient checkpointing, which keeps the old default)
   and `pin_memory` (no GPU) are silenced; nothing else is.

After the run, `--check` runs the trained module in fp32 (a fresh `Model` from the package, loaded
with the final state) over the first conversation, as the dataset presents it without noise, and
saves inputs and output to `OUT/check.safetensors` so the converted head can be compared with it.
`OUT/summary.json`: steps, seconds, tokens, padded_tokens, step_seconds, bs, peak_rss_gb (this
process's, after the check), the train files.
`OUT/work/base` (the weight view of 1., with its copy of a tied embedding) is removed at the end.

The helpers above `main()` use only the standard library, torch and safetensors, so the fast tests
import this file from the project's own venv.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
import types
from pathlib import Path

INDEX = "model.safetensors.index.json"
LM_HEAD_FILE = "lm_head.safetensors"


# ---------------------------------------------------------------- inputs the script reads

def base_view(target: Path, dest: Path) -> Path:
    """A folder the script's weight lookup works in: symlinks to `target`'s files, a safetensors index
    naming every tensor (an existing index is extended, not replaced) and, when the target has no
    `lm_head.weight` (tied embeddings), `lm_head.safetensors` holding the embedding under that name."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    target, dest = Path(target).resolve(), Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for f in target.iterdir():
        if f.name != INDEX and f.is_file():
            (dest / f.name).symlink_to(f)
    if (target / INDEX).exists():
        weight_map = dict(json.loads((target / INDEX).read_text())["weight_map"])
    else:
        files = sorted(target.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{target}: no *.safetensors weights (the EAGLE trainer reads safetensors or an indexed .bin)")
        weight_map = {}
        for f in files:
            with safe_open(str(f), framework="pt") as h:
                weight_map.update({k: f.name for k in h.keys()})
    if "lm_head.weight" not in weight_map:
        emb = "model.embed_tokens.weight"
        if emb not in weight_map:
            raise KeyError(f"{target}: neither lm_head.weight nor {emb} among the weights")
        with safe_open(str(target / weight_map[emb]), framework="pt") as h:
            save_file({"lm_head.weight": h.get_tensor(emb).contiguous()}, str(dest / LM_HEAD_FILE))
        weight_map["lm_head.weight"] = LM_HEAD_FILE
    (dest / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    return dest


def head_config(target_config: dict) -> dict:
    """The `EConfig` json of a one-layer head for a target (a LlamaConfig-style dict, transformers 4.x
    or 5.x): the target's sizes, `num_hidden_layers` 1, no rope scaling (the script's rotary embedding
    takes none but linear/dynamic and always uses base 10000)."""
    t = dict(target_config.get("text_config") or target_config)
    heads = t["num_attention_heads"]
    if t.get("head_dim") not in (None, t["hidden_size"] // heads):
        raise ValueError(f"head_dim {t['head_dim']} != hidden_size/heads: the EAGLE-1/2 trainer sizes heads as hidden_size // heads")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": t["vocab_size"],
        "hidden_size": t["hidden_size"],
        "intermediate_size": t["intermediate_size"],
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": t.get("num_key_value_heads") or heads,
        "hidden_act": t.get("hidden_act", "silu"),
        "max_position_embeddings": t.get("max_position_embeddings", 2048),
        "rms_norm_eps": t.get("rms_norm_eps", 1e-6),
        "initializer_range": t.get("initializer_range", 0.02),
        "bos_token_id": t.get("bos_token_id"),
        "eos_token_id": t.get("eos_token_id"),
        "pretraining_tp": 1,
        "tie_word_embeddings": False,
        "rope_scaling": None,
        "torch_dtype": "float32",
    }


def lr_multiplier(warmup: int, decay_steps: int, schedule: str, min_ratio: float):
    """The schedule's multiplier at scheduler step s, with HF's warmup (s / warmup, 0 at the first step)
    as in `get_linear_schedule_with_warmup`; after warmup a decay from 1 to `min_ratio` at `decay_steps`."""
    if schedule not in ("linear", "cosine", "constant"):
        raise ValueError(f"schedule {schedule!r}: linear, cosine or constant")

    def f(s: int) -> float:
        if s < warmup:
            return s / max(1, warmup)
        if schedule == "constant" or decay_steps <= warmup:
            return 1.0
        progress = min(1.0, (s - warmup) / max(1, decay_steps - warmup))
        decay = 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return min_ratio + (1.0 - min_ratio) * decay

    return f


def split_sizes(n_files: int) -> int:
    """The script's train split: the first int(n * 0.95) files in walk order."""
    return int(n_files * 0.95)


# ---------------------------------------------------------------- running the script

class _Stop(Exception):
    """Raised from the train loader once the requested optimizer steps are done."""


class _Run:
    """What the patches record while the script runs."""

    def __init__(self, args):
        self.args = args
        self.log = open(Path(args.out) / "wandb_log.jsonl", "w")
        self.step = 0
        self.tokens = 0
        self.padded = 0
        self.step_seconds: list[float] = []
        self.t0: float | None = None
        self.t_end: float | None = None
        self.accelerator = None
        self.model = None
        self.train_loader = None
        self.train_files: list[str] = []

    def write(self, record: dict) -> None:
        self.log.write(json.dumps(record, default=float) + "\n")
        self.log.flush()

    def check_split(self, loader) -> None:
        data = Path(self.args.data).resolve()
        files = sorted(str(Path(p).resolve()) for p in loader.dataset.data)
        own = sorted(str(p.resolve()) for p in data.iterdir() if p.is_file())
        if files != own:
            raise RuntimeError(f"the script's train split ({len(files)} files) is not the {len(own)} files of {data}; "
                               "write the data with evaluation.ref_eagle_llm.write_data")
        self.train_files = files

    def batches(self, loader):
        """The train loader for exactly `--steps` optimizer steps, re-iterated when it runs out."""
        self.check_split(loader)
        self.t0 = last = time.perf_counter()
        it = iter(loader)
        fresh = True
        while self.step < self.args.steps:
            try:
                batch = next(it)
            except StopIteration:
                if fresh:
                    raise RuntimeError("the train loader yields no batch") from None
                it, fresh = iter(loader), True
                continue
            fresh = False
            self.tokens += int(batch["attention_mask"].sum())
            self.padded += int(batch["attention_mask"].numel())
            yield batch  # the script takes its step, then logs it
            self.step += 1
            now = time.perf_counter()
            self.step_seconds.append(now - last)
            last = now
        self.t_end = time.perf_counter()
        raise _Stop


def _wandb_stub(run: _Run) -> types.ModuleType:
    mod = types.ModuleType("wandb")
    mod.init = lambda *a, **kw: run.write({"init": {k: v for k, v in kw.items() if k != "entity"}})
    mod.log = lambda data, *a, **kw: run.write({"step": run.step + 1, **data})  # called before the step counter moves
    mod.finish = lambda *a, **kw: None
    return mod


def _patch(run: _Run) -> None:
    import accelerate
    import accelerate.utils
    import torch
    import tqdm as tqdm_mod
    import transformers
    from torch import nn

    args = run.args
    sys.modules["wandb"] = _wandb_stub(run)  # 3.
    torch.Tensor.cuda = lambda self, *a, **kw: self  # 4.
    nn.Module.cuda = lambda self, *a, **kw: self

    def tqdm(iterable=None, *a, **kw):  # 5.
        return run.batches(iterable) if iterable is run.train_loader else iterable

    tqdm_mod.tqdm = tqdm

    original_prepare = accelerate.Accelerator.prepare

    def prepare(self, *objs, **kw):  # 6.: keep the model and the train loader
        out = original_prepare(self, *objs, **kw)
        run.accelerator = self
        run.model = out[0]
        loaders = [o for o in out if isinstance(o, torch.utils.data.DataLoader)]
        run.train_loader = loaders[0]
        return out

    accelerate.Accelerator.prepare = prepare

    def schedule(optimizer, num_warmup_steps, num_training_steps, last_epoch=-1):  # 7.
        f = lr_multiplier(args.warmup_steps, args.decay_steps, args.schedule, args.min_lr_ratio)
        run.write({"schedule": {"script_warmup": num_warmup_steps, "script_total": num_training_steps,
                                "warmup": args.warmup_steps, "decay_steps": args.decay_steps,
                                "schedule": args.schedule, "min_lr_ratio": args.min_lr_ratio}})
        return torch.optim.lr_scheduler.LambdaLR(optimizer, f, last_epoch)

    transformers.get_linear_schedule_with_warmup = schedule

    class AdamW(torch.optim.AdamW):  # 8.
        def __init__(self, params, *a, **kw):
            kw.setdefault("weight_decay", args.weight_decay)
            super().__init__(params, *a, **kw)

    torch.optim.AdamW = AdamW

    original_seed = accelerate.utils.set_seed
    accelerate.utils.set_seed = lambda seed, *a, **kw: original_seed(args.seed, *a, **kw)  # 9.

    if args.num_workers is not None:  # 11.
        original_init = torch.utils.data.DataLoader.__init__

        def init(self, *a, **kw):
            kw["num_workers"] = args.num_workers
            original_init(self, *a, **kw)

        torch.utils.data.DataLoader.__init__ = init


def _check(run: _Run, config_path: Path, base: Path, state: dict) -> None:
    """The trained module in fp32 over the first train conversation, without noise: OUT/check.safetensors."""
    import torch
    from eagle.model.cnets import Model
    from eagle.model.configs import EConfig
    from safetensors.torch import save_file

    model = Model(EConfig.from_pretrained(str(config_path)), load_emb=True, path=str(base))
    model.load_state_dict(state)
    model.eval()
    data = torch.load(run.train_files[0])
    hidden = data["hidden_state"][None].float()  # [1, T, H]
    ids = torch.cat([data["input_ids"][1:], torch.zeros(1, dtype=data["input_ids"].dtype)])[None].long()  # x_{t+1}
    with torch.no_grad():
        out = model(hidden, input_ids=ids)
    save_file({"hidden": hidden[0].contiguous(), "next_ids": ids[0].contiguous(), "output": out[0].float().contiguous()},
              str(Path(run.args.out) / "check.safetensors"))


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help="the target's folder (config.json, safetensors)")
    p.add_argument("--data", required=True, help="the conversations (evaluation.ref_eagle_llm.write_data)")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, required=True, help="optimizer steps, then stop")
    p.add_argument("--lr", type=float, default=3e-5)
    p.add_argument("--bs", type=int, default=4, help="conversations per batch (padded to the longest)")
    p.add_argument("--warmup-steps", type=int, default=2000)
    p.add_argument("--decay-steps", type=int, default=800000, help="end of the decay (the script's total_steps)")
    p.add_argument("--schedule", default="linear", choices=["linear", "cosine", "constant"])
    p.add_argument("--min-lr-ratio", type=float, default=0.0)
    p.add_argument("--weight-decay", type=float, default=0.01, help="torch AdamW's default, which the script gets")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-workers", type=int, default=None, help="DataLoader workers (the script's: 2)")
    p.add_argument("--check", action="store_true", help="save the trained module's output on one conversation")
    return p.parse_args(argv)


def main(argv=None) -> int:
    import resource
    import runpy
    import warnings

    args = parse(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    args.out = str(out)
    work = out / "work"
    work.mkdir(exist_ok=True)
    base = base_view(Path(args.target), work / "base")  # 1.
    config_path = work / "config.json"  # 2.
    config_path.write_text(json.dumps(head_config(json.loads((Path(args.target) / "config.json").read_text())), indent=1))

    # the package is named `eagle`, like this project's: never let a checkout on sys.path shadow it
    sys.path[:] = [p for p in sys.path if "site-packages" in p or not (Path(p or ".") / "eagle" / "__init__.py").exists()]
    import eagle.train  # noqa: F401

    if "site-packages" not in str(Path(sys.modules["eagle"].__file__)):
        raise RuntimeError(f"`eagle` resolves to {sys.modules['eagle'].__file__}, not the eagle-llm package")

    warnings.filterwarnings("ignore", message=".*use_reentrant.*")
    warnings.filterwarnings("ignore", message=".*pin_memory.*")
    run = _Run(args)
    _patch(run)
    sys.argv = ["eagle/train/main.py", "--basepath", str(base), "--configpath", str(config_path),
                "--lr", repr(args.lr), "--bs", str(args.bs), "--gradient-accumulation-steps", "1",
                "--tmpdir", str(Path(args.data).resolve()), "--outdir", str(work / "outdir"), "--cpdir", str(work / "cpdir")]
    try:
        runpy.run_module("eagle.train.main", run_name="__main__", alter_sys=True)
        raise RuntimeError("the script ended before the requested steps")
    except _Stop:
        pass
    import torch

    model = run.accelerator.unwrap_model(run.model)
    state = {k: v.detach().cpu().float().clone() for k, v in model.state_dict().items()}
    (out / "state_final").mkdir(exist_ok=True)
    torch.save(state, out / "state_final" / "pytorch_model.bin")  # 6.
    shutil.copy(config_path, out / "state_final" / "config.json")
    summary = {"steps": run.step, "seconds": run.t_end - run.t0, "tokens": run.tokens, "padded_tokens": run.padded,
               "step_seconds": run.step_seconds, "bs": args.bs, "lr": args.lr, "threads": torch.get_num_threads(),
               "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
               "train_files": run.train_files, "argv": sys.argv[1:]}
    if args.check:
        _check(run, config_path, base, state)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    shutil.rmtree(base, ignore_errors=True)
    run.log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
