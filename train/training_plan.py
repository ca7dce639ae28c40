"""Preflight of a training run: the store's plan (data_prep/plan.py) and what training adds.

    python -m train +model=NAME [...] plan=true

On top of the store's lines it prints the peak device memory per rank of a training step
(train/step_memory.py) for both feature sources, what rank 0 adds for the τ judge, a warning when a
peak exceeds `plan_gpu.memory_gb`, and what both ways of feeding the trainer cost in GPU-hours,
recommending one (`Choice`): the store (`train.features=store`: disk, one target pass, then every
epoch reads the store at `plan_gpu.read_gb_per_s` per rank, overlapping the head's compute) or online
(`train.features=online`: no disk, a target forward in every step).

FLOPs per token, at `plan_gpu.tflops` per GPU: the target's forward 2 × its parameters; the head per
pass (`train.ttt_steps`) 6 × its parameters, 12 × attention width × the keys a row attends to (S/2
in pass 0, (i+1)·S in pass i) and, EAGLE-1/2, 4 × V_draft × H through the frozen lm_head rows; once
2 × V × H for the target's distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from data_prep.data_config import prep_config
from data_prep.plan import GB, Plan, TargetSizes, dtype_bytes, extra_layers, forward_bytes, store_plan
from eagle.heads.checkpoint import build_head
from eagle.heads.draft_vocab import draft_vocab_size
from eagle.heads.eagle2 import DraftConfig
from train.engine import compute_dtype, ds_config
from train.head_config import as_eagle3
from train.optimizers import muon_matrix
from train.step_memory import StepMemory, StepShape, step_memory


@dataclass
class Choice:
    """Offline store against online features for the planned training run."""

    epochs: float
    target_flops: float  # one target forward over all tokens (data_prep's pass, or one online epoch's)
    head_flops: float  # one epoch of the head's training
    online_gb: float  # peak device memory per rank online
    read_seconds: float  # one epoch's read of the store by one GPU at `read_gb_per_s`
    flops_per_s: float  # plan_gpu.tflops
    read_gb_per_s: float

    def gpu_hours(self) -> tuple[float, float]:
        """(store, online): GPU-hours of the whole run each way. The store's epochs take the longer
        of the head's compute and the store's read; its one target pass comes first."""
        head, target = self.head_flops / self.flops_per_s, self.target_flops / self.flops_per_s
        store = target + self.epochs * max(head, self.read_seconds)
        return store / 3600, self.epochs * (target + head) / 3600

    def recommend(self, plan: Plan) -> tuple[str, str]:
        if not plan.fits:
            return "online", "the store does not fit on its disk"
        if plan.store_bytes > plan.free_bytes / 2:
            return "online", "the store would take more than half of the free disk"
        if self.epochs <= 1:
            return "online", "one epoch reads the features once: online costs the same target pass and no disk"
        store, online = self.gpu_hours()
        read_bound = self.read_seconds * self.flops_per_s > self.head_flops
        if store >= online:
            return "online", (f"reading the store at {self.read_gb_per_s:g} GB/s per GPU (plan_gpu.read_gb_per_s) "
                              f"makes its {self.epochs:g} epochs {store:,.0f} GPU-hours against online's {online:,.0f}")
        why = f", even read at {self.read_gb_per_s:g} GB/s per GPU" if read_bound else ""
        return "store", (f"it fits, and its {self.epochs:g} epochs take {store:,.0f} GPU-hours against online's "
                         f"{online:,.0f} (a target forward every epoch){why}")

    def lines(self, plan: Plan) -> list[str]:
        kind, why = self.recommend(plan)
        store, online = self.gpu_hours()
        read = self.read_seconds * self.flops_per_s / self.head_flops
        return [f"option store (train.features=store): {plan.store_bytes / GB:,.2f} GB on disk, one target pass "
                f"({self.target_flops / 1e15:,.1f} PFLOP) before training; each epoch reads it in {read:,.1f}x the "
                f"head's compute time ({self.read_gb_per_s:g} GB/s per GPU): {store:,.0f} GPU-hours",
                f"option online (train.features=online): no disk; a target forward in every step, "
                f"+{self.target_flops / 1e15:,.1f} PFLOP per epoch over the head's {self.head_flops / 1e15:,.1f} "
                f"({self.epochs:g} epochs): {online:,.0f} GPU-hours, {self.online_gb:,.1f} GB device memory per rank "
                f"with the target",
                f"recommended: train.features={kind} ({why})"]


@dataclass
class TrainPlan:
    store: Plan  # data_prep's side
    head_params: int
    memory: dict[str, StepMemory]  # peak of a training step per rank, by train.features
    judge_bytes: float  # what rank 0 adds for τ (0: τ off, or online where the judge uses the loaded target)
    cfg: DictConfig
    choice: Choice

    def lines(self) -> list[str]:
        t = self.cfg.train
        memory = [f"memory per rank, train device (head {self.head_params / 1e6:.0f}M params + optimizer, frozen "
                  f"embed/lm_head, {t.ttt_steps} training-time-test pass(es) over a micro-batch of "
                  f"{int(t.batch_tokens):,} tokens):"]
        memory += [f"  peak device memory per rank, train.features={f}: {m.peak / GB:,.1f} GB ({_parts(m)})"
                   f"{' <- this run' if f == t.features else ''}" for f, m in self.memory.items()]
        if self.judge_bytes:
            memory.append(f"  rank 0 with τ (train.tau_every={t.tau_every}): +{self.judge_bytes / GB:,.1f} GB "
                          "(the judge's target, its KV cache and a copy of the head)")
        return self.store.lines() + memory + self._warnings() + self.choice.lines(self.store)

    def _warnings(self) -> list[str]:
        gpu, features = float(self.cfg.plan_gpu.memory_gb), str(self.cfg.train.features)
        peak = (self.memory[features].peak + self.judge_bytes) / GB
        out = []
        if peak > gpu:
            out.append(f"WARNING: train.features={features} needs {peak:,.1f} GB on a rank, which exceeds the "
                       f"{gpu:g} GB of plan_gpu.memory_gb: lower train.batch_tokens or train.ttt_steps, or shard the head's states "
                       "(deepspeed=zero2_bf16)")
        prep = max(v for k, v in self.store.memory.items() if "device" in k)
        if prep > gpu:
            out.append(f"WARNING: data_prep's target and batch need {prep:,.1f} GB on a rank, more than "
                       f"plan_gpu.memory_gb={gpu:g}")
        return out


def _parts(m: StepMemory) -> str:
    held = [("head states", m.states), ("frozen matrices", m.frozen), ("the target", m.target)]
    text = ", ".join(f"{name} {b / GB:,.1f}" for name, b in held if b)
    working = (f"micro-batch {m.batch / GB:,.1f}, passes {m.passes / GB:,.1f} (keys/values {m.keys_values / GB:,.1f}, "
               f"masks {m.masks / GB:,.1f}), loss {m.loss / GB:,.1f}")
    if m.working > m.batch + m.passes + m.loss:
        working = f"larger: the target's forward or the optimizer step {m.working / GB:,.1f}"
    return f"{text}; {working}"


def training_plan(cfg: DictConfig) -> TrainPlan:
    """The plan of a training run of `cfg` (validated by train.config.validate)."""
    prep = prep_config(cfg)
    store = store_plan(prep)
    t, extra, tr, gpu = store.target, extra_layers(prep.model), cfg.train, cfg.plan_gpu
    rows = _loss_rows(tr.draft_vocab, t, extra)
    head = head_parameters(t, extra, rows[0], tr)
    shape = _shape(cfg, t, extra, rows, head)
    element = dtype_bytes(prep.model.dtype)
    memory = {"store": step_memory(shape), "online": _online(step_memory(shape), shape, t, extra, element)}
    epochs = float(tr.epochs)
    if tr.max_steps:
        epochs = tr.max_steps * int(tr.batch_tokens) * int(tr.grad_accum or 1) / max(1, store.tokens)
    head_flops = store.tokens * _head_flops_per_token(shape, rows[1])
    choice = Choice(round(epochs, 2), 2 * t.params * store.tokens, head_flops, memory["online"].peak / GB,
                    store.store_bytes / (float(gpu.read_gb_per_s) * GB), float(gpu.tflops) * 1e12,
                    float(gpu.read_gb_per_s))
    judge = _judge_bytes(t, prep.model.max_len, element, head.total) if tr.tau_every and tr.features == "store" else 0.0
    return TrainPlan(store, head.total, memory, judge, cfg, choice)


def _shape(cfg: DictConfig, t: TargetSizes, extra: int, rows: tuple[int, int], head: HeadParams) -> StepShape:
    tr, prep = cfg.train, prep_config(cfg)
    conf = ds_config(cfg)
    drafted = rows[0]
    copied = drafted if drafted < t.vocab and (extra or draft_vocab_size(tr.draft_vocab, t.vocab)) else 0
    return StepShape(
        tokens=int(tr.batch_tokens), seq=int(prep.model.max_len), passes=int(tr.ttt_steps), hidden=t.hidden,
        intermediate=t.intermediate, attention_width=t.attention_width, kv_width=t.kv_width,
        input_width=t.hidden * max(1, extra), store_width=t.hidden * (1 + extra), draft_rows=drafted,
        frozen_rows=2 * t.vocab, loss_copy_rows=copied, vocab=t.vocab, head_params=head.total, eagle3=bool(extra),
        frozen_head_params=head.frozen, muon_params=head.muon,
        noise=float(tr.noise) > 0, element=torch.empty((), dtype=compute_dtype(conf)).element_size(),
        store_element=dtype_bytes(prep.model.dtype),
        zero_stage=int(conf.get("zero_optimization", {}).get("stage", 0)), ranks=int(cfg.plan_gpu.ranks))


def _online(m: StepMemory, s: StepShape, t: TargetSizes, extra: int, element: int) -> StepMemory:
    """The step online: the target's weights on every rank; the embed/lm_head are its own when it runs
    in the compute dtype (train/trainer.py _frozen); its forward comes before the head's."""
    own = element == s.element  # the target's embed/lm_head serve as the frozen matrices
    frozen = (s.loss_copy_rows + (0 if own else s.frozen_rows)) * s.hidden * s.element
    return StepMemory(m.states, frozen, t.params * element, m.batch, m.passes, m.keys_values, m.masks, m.loss,
                      m.optimizer_step, forward_bytes(s.tokens, t, extra, element))


def _judge_bytes(t: TargetSizes, max_len: int, element: int, head: int) -> float:
    """Rank 0's τ judge offline: the target loaded once, a KV cache of max_len rows, the head's weights."""
    return t.params * element + 2 * t.layers * max_len * t.kv_width * element + 2 * head * element


def _head_flops_per_token(s: StepShape, target_rows: int) -> float:
    keys = [s.seq / 2] + [(i + 1) * s.seq for i in range(1, s.passes)]
    frozen_rows = 0 if s.eagle3 else 4 * s.draft_rows * s.hidden
    per_pass = 6 * s.head_params + frozen_rows
    return s.passes * per_pass + sum(12 * s.attention_width * k for k in keys) + 2 * target_rows * s.hidden


def _loss_rows(draft_vocab: int | None, t: TargetSizes, extra: int) -> tuple[int, int]:
    """(draft vocabulary rows, rows of the target distribution) of the token loss: EAGLE-3 takes the
    target's distribution over the whole vocabulary, EAGLE-1/2 over the draft rows."""
    drafted = min(draft_vocab_size(draft_vocab, t.vocab) or t.vocab, t.vocab)
    return drafted, t.vocab if extra else drafted


@dataclass
class HeadParams:
    """Parameters of the head a run trains: all, those out of the optimizer (a frozen lm_head) and those
    Muon steps (`train.optimizer=muon`: one fp32 moment instead of Adam's two)."""

    total: int
    frozen: int = 0
    muon: int = 0


def head_parameters(t: TargetSizes, extra: int, draft_rows: int, tr) -> HeadParams:
    """The parameters of the head `tr` (the train config) trains (train/head_config.py), counted on a
    meta-device copy. A preset without head counts is taken as full multi-head attention of 128-wide heads."""
    heads = t.heads or max(1, t.hidden // 128)
    cfg = DraftConfig(hidden_size=t.hidden, intermediate_size=t.intermediate, num_attention_heads=heads,
                      num_key_value_heads=t.kv_heads or heads, vocab_size=t.vocab,
                      head_dim=t.head_dim or t.hidden // heads, fc_bias=bool(tr.fc_bias),
                      num_hidden_layers=int(tr.head_layers or 1))
    if extra:
        as_eagle3(cfg, list(range(extra)), draft_rows, bool(tr.eagle3_norms))
    with torch.device("meta"):
        named = list(build_head(cfg).named_parameters())
    frozen = {n for n, _ in named if extra and tr.freeze_lm_head and n.startswith("lm_head.")}
    muon = sum(p.numel() for n, p in named if tr.optimizer == "muon" and n not in frozen and muon_matrix(n, p))
    return HeadParams(sum(p.numel() for _, p in named), sum(p.numel() for n, p in named if n in frozen), muon)
