"""Resuming a DeepSpeed checkpoint saved in the other precision: a bf16 run continued on a CPU without
bf16 arithmetic (train/engine.py `on_device` trains it in fp32 there), or an fp32 run continued where
bf16 is fast.

DeepSpeed names and shapes its files by the engine's precision and cannot load the other kind:

- ZeRO 1-3: the optimizer partitions are `bf16_zero_pp_rank_R_...` in a bf16 run and
  `zero_pp_rank_R_...` in an fp32 one; their contents (fp32 master partitions and the moments) are
  the same, so the files are loaded under the names they were saved with.
- ZeRO 0: a bf16 engine wraps the optimizer (fp32 master copies, `fp32_groups`, beside the torch
  optimizer's state, `optimizer_state_dict`); an fp32 engine saves the torch optimizer's state alone.
  The module and schedule load as usual; the optimizer's state is translated, and the fp32 weights
  come from the master copies (bf16 → fp32) or from the saved module (fp32 → bf16 masters).

Nothing is lost either way: the fp32 weights, the moments and the schedule's position come back.

    load_checkpoint(engine, load_dir, tag)   # engine.load_checkpoint's (load_path, client_state)
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path

import torch

log = logging.getLogger("train")
MODEL_STATES = "mp_rank_00_model_states.pt"


def load_checkpoint(engine, load_dir: str, tag: str):
    """engine.load_checkpoint(load_dir, tag), whichever precision the checkpoint was saved in."""
    saved = saved_in_bf16(Path(load_dir) / tag)
    if saved is None or saved == engine.bfloat16_enabled():
        return engine.load_checkpoint(load_dir, tag=tag)
    log.info("%s was saved by a %s run; this one trains in %s: loading its weights, moments and schedule "
             "in this precision", Path(load_dir) / tag, _name(saved), _name(engine.bfloat16_enabled()))
    if engine.zero_optimization():
        with _zero_files_named(engine, saved):
            return engine.load_checkpoint(load_dir, tag=tag)
    load_path, client = engine.load_checkpoint(load_dir, tag=tag, load_optimizer_states=False)
    if load_path is not None:
        _load_stage0_optimizer(engine, client.pop("optimizer"), Path(load_path))
    return load_path, client


def saved_in_bf16(tag_dir: Path) -> bool | None:
    """Was this checkpoint saved by a bf16 engine? None when its files do not say."""
    optim = [p.name for p in tag_dir.glob("*zero_pp_rank_*_optim_states.pt")]
    if optim:
        return any(n.startswith("bf16_") for n in optim)
    if not (tag_dir / MODEL_STATES).is_file():
        return None
    conf = torch.load(tag_dir / MODEL_STATES, map_location="cpu", weights_only=False, mmap=True).get("ds_config") or {}
    return bool(conf.get("bf16", {}).get("enabled"))


@contextmanager
def _zero_files_named(engine, bf16: bool):
    """While loading, the engine looks for the ZeRO files under the names a `bf16` engine gives them."""
    engine._get_zero_ckpt_prefix = lambda dp_rank, bf16_mode: f"{'bf16_' if bf16 else ''}zero_pp_rank_{dp_rank}"
    try:
        yield
    finally:
        del engine._get_zero_ckpt_prefix  # the class's method again


def _load_stage0_optimizer(engine, saved: dict, load_path: Path) -> None:
    """The saved optimizer state of a ZeRO-0 engine of the other precision, into this one's."""
    if engine.bfloat16_enabled():  # fp32 checkpoint → bf16 engine: masters from the saved fp32 module
        wrapper = engine.optimizer
        wrapper.optimizer.load_state_dict(saved)
        module = torch.load(load_path, map_location="cpu", weights_only=False, mmap=True)["module"]
        names = {id(p): n for n, p in engine.module.named_parameters()}
        for masters, params in zip(wrapper.fp32_groups, wrapper.fp16_groups):
            for master, param in zip(masters, params):
                master.data.copy_(module[names[id(param)]])
        return
    engine.optimizer.load_state_dict(saved["optimizer_state_dict"])  # bf16 checkpoint → fp32 engine
    for group, masters in zip(engine.optimizer.param_groups, saved["fp32_groups"]):
        for param, master in zip(group["params"], masters):
            param.data.copy_(master)


def _name(bf16: bool) -> str:
    return "bf16" if bf16 else "fp32"
