"""The weights a run starts from: a fresh head, or an exported head's (fine-tuning).

Resuming a run (train/checkpoints.py) overrides both. A fresh EAGLE-3 head may start its
lm_head and final norm from the target's (`train.init_lm_head`): the target's rows of its
draft vocabulary, so its output space is the target's from step 0. A fine-tune of an EAGLE-3 head
whose lm_head rows are the target's may widen its draft vocabulary (`widened_lm_head`): rows are
appended, none moves, so the start's drafts score as before. A fine-tune may also stack decoder layers
on its start (`train.head_layers`, `load_deepened`): they add nothing until training moves them.
"""

from __future__ import annotations

import logging

import torch

from eagle.heads.checkpoint import Head, build_head
from eagle.heads.eagle2 import DraftConfig

log = logging.getLogger("train")


def initial_head(config: DraftConfig, start: Head | None = None, start_name: str | None = None,
                 lm_head_rows: torch.Tensor | None = None) -> Head:
    """A fresh head of `config`, or one holding the weights of `start` (the exported head `start_name`).
    lm_head_rows [Vd, H]: the target's rows of the run's draft vocabulary, for an EAGLE-3 start widened
    to `config.draft_vocab_size` rows."""
    head = build_head(config)
    if start is None:
        return head
    s = start.config
    if s.architecture != config.architecture:
        raise ValueError(f"train.init_head={start_name}: an {s.architecture} head cannot start an "
                         f"{config.architecture} run")
    if (s.hidden_size, s.vocab_size) != (config.hidden_size, config.vocab_size):
        raise ValueError(f"train.init_head={start_name}: head for hidden {s.hidden_size} / vocab {s.vocab_size}, "
                         f"target has {config.hidden_size} / {config.vocab_size}")
    state = start.state_dict()
    if not config.fc_bias and state.pop("fc.bias", None) is not None:
        log.info("train.fc_bias=false: the starting head's fc bias is dropped")
    elif config.fc_bias and "fc.bias" not in state:
        state["fc.bias"] = torch.zeros_like(head.fc.bias)
    if config.architecture == "eagle3" and config.draft_vocab_size != s.draft_vocab_size:
        state["lm_head.weight"] = widened_lm_head(state["lm_head.weight"], lm_head_rows)
        log.info("draft vocabulary widened from %d to %d tokens: the target's rows of the new ones appended",
                 s.draft_vocab_size, config.draft_vocab_size)
    if config.num_hidden_layers > s.num_hidden_layers:
        load_deepened(head, state, s.num_hidden_layers)
        log.info("%d decoder layers stacked on the starting head's %d, their output projections zero",
                 config.num_hidden_layers - s.num_hidden_layers, s.num_hidden_layers)
    else:
        head.load_state_dict(state)
    log.info("initialised the head from %s", start_name)
    return head


@torch.no_grad()
def load_deepened(head: Head, state: dict[str, torch.Tensor], start_layers: int) -> None:
    """A deeper head from a start's weights `state`: layers `start_layers`.. keep their fresh weights but
    add nothing yet (attention's o_proj and the MLP's down_proj zero), so the head computes what the start
    did, and the first gradients reach those projections."""
    new = tuple(f"layers.{i}." for i in range(start_layers, head.config.num_hidden_layers))
    missing, unexpected = head.load_state_dict(state, strict=False)
    if unexpected or any(not key.startswith(new) for key in missing):
        raise ValueError(f"a deeper head's weights: unexpected {unexpected}, missing {missing}")
    for key, weight in head.state_dict(keep_vars=True).items():
        if key.startswith(new) and key.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            weight.zero_()


def lm_head_is_targets(start: Head, target_lm_head: torch.Tensor) -> bool:
    """Whether an EAGLE-3 head's lm_head rows are the target's rows of its draft tokens (trained with
    train.freeze_lm_head), compared in bf16, the dtype heads are exported in. target_lm_head [V, H]"""
    if start.config.architecture != "eagle3":
        return False
    rows = target_lm_head if start.draft_ids is None else target_lm_head[start.draft_ids.to(target_lm_head.device)]
    own = start.lm_head.weight.detach()
    return rows.shape == own.shape and torch.equal(rows.to("cpu", torch.bfloat16), own.to("cpu", torch.bfloat16))


def widened_lm_head(own: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """The lm_head [Vd, H] of a widened EAGLE-3 start: the target's `rows` of the run's draft vocabulary,
    whose first tokens are the start's own (TrainingVocabulary.choose), so its rows [Vs, H] come first
    unchanged."""
    if rows is None or rows.shape[0] <= own.shape[0]:
        raise ValueError(f"widening an lm_head of {own.shape[0]} rows needs the target's rows of more tokens")
    return torch.cat([own, rows[own.shape[0]:].to(own.device, own.dtype)])


@torch.no_grad()
def start_from_target(head: Head, lm_head_rows: torch.Tensor, norm: torch.Tensor | None) -> None:
    """An EAGLE-3 head's lm_head := the target's rows of its draft vocabulary [Vd, H], its norm := the target's."""
    head.lm_head.weight.copy_(lm_head_rows.float())
    if norm is not None:
        head.norm.weight.copy_(norm.float())
    log.info("EAGLE-3 lm_head and norm start from the target's")


def freeze_lm_head(head: Head, started: bool) -> None:
    """An EAGLE-3 head's lm_head out of the optimizer (`train.freeze_lm_head`): it keeps the rows it
    started from, which must be the target's or a starting head's (`started`), not random ones."""
    if head.config.architecture != "eagle3":
        raise ValueError("train.freeze_lm_head: only an EAGLE-3 head has an lm_head of its own")
    if not started:
        raise ValueError("train.freeze_lm_head needs train.init_lm_head=true (or train.init_head): a frozen "
                         "random lm_head would never learn")
    head.lm_head.requires_grad_(False)
    log.info("EAGLE-3 lm_head frozen: fc, the decoder layer and the norms train")
