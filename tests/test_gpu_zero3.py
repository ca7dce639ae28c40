"""EAGLE-3 training under DeepSpeed ZeRO-3 (one CPU process, gloo): the parameters are partitioned,
and ZeRO-3 gathers them for the engine's forward. The token loss's logits (the head's norm and
lm_head) run through that forward too (`Eagle3Head.forward(..., logits_only=True)`), so no weight
is read while it is partitioned, and every rank runs the same gathers."""

from __future__ import annotations

import math
from contextlib import contextmanager

import pytest
import torch
from hydra import compose, initialize_config_dir

from tests.tiny import CONF, tiny_llama, write_tiny_store
from train.config import validate
from train.data import loader
from train.engine import full_state_dict
from train.trainer import Trainer

ZERO3 = ("deepspeed=zero3_bf16", "deepspeed.bf16.enabled=false",  # fp32: ZeRO-3 and ZeRO-0 give the same numbers
         "deepspeed.zero_optimization.stage3_param_persistence_threshold=0")  # every parameter partitioned


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    base = tmp_path_factory.mktemp("zero3")
    model = tiny_llama(seed=0, vocab_size=512, hidden_size=64, layers=3)
    model.save_pretrained(base / "target")
    write_tiny_store(model, base / "store", records=8, min_len=32, max_len=32, target_path=str(base / "target"),
                     feature_layers=(0, 1, 2, -1))
    return base


def make_trainer(tiny, out, *extra: str) -> Trainer:
    overrides = ["+model=smollm2_135m", f"model.path={tiny / 'target'}", f"store_dir={tiny / 'store'}",
                 f"output_dir={out}", "wandb.mode=disabled", "head=eagle3", "model.feature_layers=[0,1,2,-1]",
                 "train.draft_vocab=256", "train.ttt_steps=3", "train.batch_tokens=128", "train.lr=3e-3",
                 "train.optimizer=adamw", "train.freeze_lm_head=false",  # Muon runs at ZeRO stage 0 only
                 "train.warmup_steps=0", "train.eval_fraction=0.25", "train.eval_every=0", "train.save_every=0",
                 "train.tau_every=0", "train.progress=false", "train.max_steps=2", *extra]
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return Trainer(validate(compose(config_name="config", overrides=overrides)))


def two_steps_on_one_batch(trainer: Trainer) -> list[float]:
    batch = next(iter(loader(trainer.records, trainer.planned_batches(0, 1))))
    return [float(trainer.micro_step(batch, 0).loss) for _ in range(2)]


def test_zero3_trains_an_eagle3_head_like_zero0(tiny, tmp_path):
    zero3 = make_trainer(tiny, tmp_path / "z3", *ZERO3)
    assert zero3.engine.zero_optimization_stage() == 3 and zero3.eagle3
    assert all(p.numel() == 0 for p in zero3.engine.module.parameters())  # partitioned outside the forward
    start = full_state_dict(zero3.engine)
    losses = two_steps_on_one_batch(zero3)
    assert all(math.isfinite(x) for x in losses) and losses[1] <= losses[0], losses
    zero0 = make_trainer(tiny, tmp_path / "z0", "deepspeed=zero0_fp32")
    assert all(torch.equal(start[k], v) for k, v in full_state_dict(zero0.engine).items())  # the same head
    assert two_steps_on_one_batch(zero0) == pytest.approx(losses, rel=1e-5)
    trained3, trained0 = full_state_dict(zero3.engine), full_state_dict(zero0.engine)
    assert not torch.equal(trained3["lm_head.weight"], start["lm_head.weight"])  # the lm_head learned
    for k in trained0:  # Adam turns rounding in near-zero gradients into differences well below one step (3e-3)
        torch.testing.assert_close(trained3[k], trained0[k], rtol=0, atol=1e-4)
    assert zero3.evaluate()["top1"] >= 0.0  # held-out loss through the engine as well


@contextmanager
def outside_forward_calls(engine):
    """Names of the head's submodules that run while the engine's module is not in its forward."""
    module, state, outside = engine.module, {"depth": 0}, []

    def enter(*_):
        state["depth"] += 1

    def leave(*_):
        state["depth"] -= 1

    def check(name):
        return lambda *_: outside.append(name) if state["depth"] == 0 else None

    handles = [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    handles += [m.register_forward_pre_hook(check(n)) for n, m in module.named_modules() if n]
    try:
        yield outside
    finally:
        for h in handles:
            h.remove()


def test_no_weight_is_used_outside_the_engines_forward(tiny, tmp_path):
    trainer = make_trainer(tiny, tmp_path, *ZERO3)
    with outside_forward_calls(trainer.engine) as outside:
        two_steps_on_one_batch(trainer)
        trainer.evaluate()
    assert outside == []
