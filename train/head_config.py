"""The head a run trains, sized from its target, and the check that the store feeds that head.

- EAGLE-1/2 (`head=eagle2`): one decoder layer over the target's last hidden state, sized like
  the target's layers; a fine-tune (`train.init_head`) keeps its starting head's shape (`keep_start_shape`),
  but `train.head_layers` may stack more decoder layers on it (`deepen`; either head type).
  `train.fc_bias=false` drops the fc bias, which vLLM's EAGLE-1 model has no place for.
- EAGLE-3 (`head=eagle3`): fuses `model.feature_layers` minus the last one, has no fc bias and its
  own lm_head of `train.draft_vocab` rows (eagle/heads/feature_layers.py); `train.eagle3_norms=true`
  trains speculators' variant of its layer. A fine-tune whose start's lm_head rows are the target's own
  (`train.freeze_lm_head`, the recipe's default) may widen its draft vocabulary to `train.draft_vocab`:
  the target's rows of more tokens join the start's (train/head_init.py `widened_lm_head`).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from data_prep.store import FeatureStore
from eagle.heads.checkpoint import Head
from eagle.heads.eagle2 import DraftConfig
from eagle.heads.feature_layers import LAST, fused_layers

HEADS = ("eagle2", "eagle3")


def draft_config(target_dir: Path, cfg: DictConfig, start: Head | None = None, widen: bool = False) -> DraftConfig:
    """The head's sizes from the target; EAGLE-3: its fused layers and draft vocabulary size.
    widen: the start's lm_head rows are the target's, so its draft vocabulary may grow to train.draft_vocab."""
    from transformers import AutoConfig

    kind = str(cfg.train.head)
    if kind not in HEADS:
        raise ValueError(f"train.head={kind!r}: choose the head with head=eagle2 or head=eagle3")
    draft = DraftConfig.from_target_config(AutoConfig.from_pretrained(target_dir), target=str(cfg.model.path),
                                           feature_layers=[LAST])
    draft.fc_bias = bool(cfg.train.fc_bias)
    if kind == "eagle3":
        stored = [int(i) for i in cfg.model.feature_layers]
        fused = fused_layers(stored)
        if len(fused) < 2 or LAST not in stored:
            raise ValueError(f"head=eagle3 needs model.feature_layers = its fused layers plus -1, got {stored}")
        size = cfg.train.draft_vocab or draft.vocab_size  # head=eagle3 sets it (conf/head/eagle3.yaml)
        as_eagle3(draft, fused, min(int(size), draft.vocab_size), bool(cfg.train.eagle3_norms))
    if start is not None:
        keep_start_shape(draft, start.config, str(cfg.train.init_head), widen)
    deepen(draft, cfg.train.head_layers, start.config if start is not None else None, str(cfg.train.init_head))
    return draft


def deepen(draft: DraftConfig, layers: int | None, start: DraftConfig | None, name: str) -> None:
    """`train.head_layers` decoder layers; a fine-tune's start may gain layers, never lose them."""
    if layers is None:
        return
    if start is not None and layers < start.num_hidden_layers:
        raise ValueError(f"train.head_layers={layers}: train.init_head={name} has {start.num_hidden_layers} "
                         f"layers; a fine-tune keeps them all")
    draft.num_hidden_layers = int(layers)


def keep_start_shape(draft: DraftConfig, start: DraftConfig, name: str, widen: bool = False) -> None:
    """A fine-tune trains its starting head as it is: its depth and MLP width and, for EAGLE-3, its
    draft vocabulary size and layer variant (train.eagle3_norms then has no say, train.draft_vocab only
    to widen a start whose lm_head rows are the target's: `widen`). An EAGLE-3 start must fuse the
    layers the store holds."""
    draft.num_hidden_layers, draft.intermediate_size = start.num_hidden_layers, start.intermediate_size
    if draft.architecture != "eagle3" or start.architecture != "eagle3":
        return  # a head of the other kind: initial_head says so
    if list(start.feature_layers) != list(draft.feature_layers):
        raise ValueError(f"train.init_head={name}: the head fuses target layers {list(start.feature_layers)}, "
                         f"model.feature_layers gives {list(draft.feature_layers)}")
    # widened up to below the whole vocabulary (unset train.draft_vocab means that): an export mapping every
    # token through d2t is one vLLM refuses
    if not (widen and start.draft_vocab_size < draft.draft_vocab_size < draft.vocab_size):
        draft.draft_vocab_size = start.draft_vocab_size
    draft.norm_before_fc, draft.norm_before_residual, draft.norm_output = (
        start.norm_before_fc, start.norm_before_residual, start.norm_output)


def as_eagle3(draft: DraftConfig, fused: list[int], draft_rows: int, norms: bool) -> None:
    """Make `draft` an EAGLE-3 head's config: `fused` target layers, no fc bias, an lm_head of `draft_rows`
    rows, and with `norms` speculators' layer variant (eagle/heads/eagle3.py)."""
    draft.architecture, draft.feature_layers, draft.fc_bias = "eagle3", fused, False
    draft.draft_vocab_size = draft_rows
    draft.norm_before_fc = draft.norm_before_residual = draft.norm_output = norms


def check_store(store: FeatureStore, store_dir: str, target: str, draft: DraftConfig) -> None:
    """The store holds what this head reads: the same hidden size and, for EAGLE-3, its layers."""
    if store.hidden_size != draft.hidden_size:
        raise ValueError(f"{store_dir}: features have hidden size {store.hidden_size}, "
                         f"target {target} has {draft.hidden_size}")
    stored = list(store.manifest["target"].get("feature_layers", [LAST]))
    if draft.architecture == "eagle3" and fused_layers(stored) != draft.feature_layers:
        raise ValueError(f"{store_dir}: the store holds layers {stored}, the EAGLE-3 head fuses "
                         f"{draft.feature_layers}: prepare a store with head=eagle3 (or matching model.feature_layers)")
