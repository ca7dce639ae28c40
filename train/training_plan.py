"""Preflight of a training run: the store's plan (data_prep/plan.py) and what training adds.

    python -m train +model=NAME [...] plan=true

On top of the store's lines (tokens, size against free disk, data_prep's memory) it prints the
training's device memory per rank (head and optimizer states, the frozen embed/lm_head, one
micro-batch) and costs both ways of feeding the trainer, recommending one (`Choice`): the store
(`train.features=store`: disk, one target pass in all) or online (`train.features=online`:
no disk, one target forward per epoch, counted as 2 × parameters FLOPs per token against the
head's training, 6 × head parameters + 4 × V_draft × H + 2 × V_target × H per token).
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from data_prep.data_config import prep_config
from data_prep.plan import GB, Plan, TargetSizes, dtype_bytes, extra_layers, forward_bytes, store_plan
from eagle.heads.draft_vocab import draft_vocab_size


@dataclass
class Choice:
    """Offline store against online features for the planned training run."""

    epochs: float
    target_flops: float  # one target forward over all tokens (data_prep's pass, or one online epoch's)
    head_flops: float  # one epoch of the head's training
    online_gb: float  # device memory per rank online: the training figure + the target and its forward

    def recommend(self, plan: Plan) -> tuple[str, str]:
        if not plan.fits:
            return "online", "the store does not fit on its disk"
        if plan.store_bytes > plan.free_bytes / 2:
            return "online", "the store would take more than half of the free disk"
        if self.epochs <= 1:
            return "online", "one epoch reads the features once: online costs the same target pass and no disk"
        return "store", (f"it fits, and {self.epochs:g} epochs read it {self.epochs:g} times for one target pass; "
                         f"online repeats that pass every epoch")

    def lines(self, plan: Plan) -> list[str]:
        per_epoch = (self.target_flops + self.head_flops) / self.head_flops
        kind, why = self.recommend(plan)
        return [f"option store (train.features=store): {plan.store_bytes / GB:,.2f} GB on disk, one target pass "
                f"({self.target_flops / 1e15:,.1f} PFLOP) before training",
                f"option online (train.features=online): no disk; a target forward in every step, "
                f"+{self.target_flops / 1e15:,.1f} PFLOP per epoch over the head's {self.head_flops / 1e15:,.1f} "
                f"({per_epoch:,.1f}x an offline epoch; {self.epochs:g} epochs), {self.online_gb:,.1f} GB device "
                f"memory per rank with the target",
                f"recommended: train.features={kind} ({why})"]


@dataclass
class TrainPlan:
    store: Plan  # data_prep's side
    head_params: int
    train_gb: float  # device memory per rank of the training step (offline)
    choice: Choice

    def lines(self) -> list[str]:
        memory = (f"memory per rank, train device (head {self.head_params / 1e6:.0f}M params + optimizer, frozen "
                  f"embed/lm_head, a micro-batch): {self.train_gb:,.1f} GB")
        return self.store.lines() + [memory] + self.choice.lines(self.store)


def training_plan(cfg: DictConfig) -> TrainPlan:
    """The plan of a training run of `cfg` (validated by train.config.validate)."""
    prep = prep_config(cfg)
    store = store_plan(prep)
    t, extra, tr = store.target, extra_layers(prep.model), cfg.train
    rows = _loss_rows(tr.draft_vocab, t, extra)
    head = _head_params(t.hidden, t.intermediate, extra)
    train_bytes = _train_bytes(int(tr.batch_tokens), t, extra, rows, head)
    epochs = float(tr.epochs)
    if tr.max_steps:
        epochs = tr.max_steps * int(tr.batch_tokens) * int(tr.grad_accum or 1) / max(1, store.tokens)
    head_flops = store.tokens * (6 * head + 4 * rows[0] * t.hidden + 2 * rows[1] * t.hidden)
    element = dtype_bytes(prep.model.dtype)
    target = t.params * element + forward_bytes(int(tr.batch_tokens), t, extra, element)
    choice = Choice(round(epochs, 2), 2 * t.params * store.tokens, head_flops, (train_bytes + target) / GB)
    return TrainPlan(store, head, train_bytes / GB, choice)


def _train_bytes(batch: int, t: TargetSizes, extra: int, rows: tuple[int, int], head: int) -> float:
    """Training's device memory per rank for a head of `head` parameters: its weights and optimizer
    states, the frozen embed/lm_head, one micro-batch."""
    # bf16 weights + fp32 master weights, grads and two Adam moments (ZeRO-2/3 shard the 16)
    states = head * 18
    frozen = 2 * t.vocab * t.hidden * 2
    drafted, target_side = rows
    activations = batch * t.hidden * 2 * (3 + extra) + batch * (drafted + target_side) * 4  # fp32 softmaxes
    return states + frozen + activations


def _loss_rows(draft_vocab: int | None, t: TargetSizes, extra: int) -> tuple[int, int]:
    """(draft vocabulary rows, rows of the target distribution) of the token loss: EAGLE-3 takes the
    target's distribution over the whole vocabulary, EAGLE-1/2 over the draft rows."""
    drafted = draft_vocab_size(draft_vocab, t.vocab) or t.vocab
    return drafted, t.vocab if extra else drafted


def _head_params(hidden: int, inter: int, extra: int) -> int:
    """One decoder layer over [feature, embedding] (fc 2H -> H); EAGLE-3 fuses its K layers first."""
    head = 2 * hidden * hidden + 4 * hidden * hidden + 3 * hidden * inter
    if extra:
        head += (extra - 1) * hidden * hidden + 2 * hidden * hidden
    return head
