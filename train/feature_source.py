"""Where the head's input features come from: a data_prep store, or the frozen target inside the
training step (`train.features=store | online`).

    source = open_features(cfg, prep, target, device)
    source.records                           # FeatureStore | TokenRecords: lengths(), tokens(i), [i]
    batch = source.fill(batch.to(device))    # online: the target's features of this micro-batch

Both sources hold the same records in the same order (data_prep/tokens.py), so the batch plan,
the draft vocabulary and the noise do not depend on the choice; only where `hidden` (and
EAGLE-3's `aux`) come from differs. Online, every rank loads the target in `model.dtype` on the
head's device, frozen; it is not part of the DeepSpeed engine, so it never enters the optimizer,
a ZeRO partition or a checkpoint. EAGLE-3's token loss reads the target's distribution from
`hidden` through the frozen lm_head, as it does offline: one target forward per micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from data_prep.data_config import PrepConfig, TargetFiles
from data_prep.target_forward import target_features
from data_prep.store import FeatureStore
from data_prep.tokens import TokenRecords, token_records
from eagle.heads.eagle2 import DraftConfig
from eagle.common.precision import fast_dtype
from eagle.targets.resolve import load_target
from train.data import Batch
from train.head_config import check_store


@dataclass
class StoreFeatures:
    """Offline: features read from the store at `store_dir` (what data_prep wrote): one shared folder
    or this node's copy of it (train/store_copies.py). A rank reads, through memory maps, the feature
    rows of its own micro-batches only (docs/reliability.md, "What a rank reads")."""

    records: FeatureStore
    store_dir: str
    target: nn.Module | None = None  # no target in memory

    def fill(self, batch: Batch) -> Batch:
        return batch  # the loader already read the features

    def check(self, draft: DraftConfig, target: str) -> None:
        check_store(self.records, self.store_dir, target, draft)

    @property
    def tokens(self) -> int:
        return int(self.records.manifest.get("tokens", 0))

    def describe(self) -> str:
        """The store's folder, under ~ when it is in the home directory (cards name no user's home)."""
        store, home = Path(self.store_dir), Path.home()
        return f"~/{store.relative_to(home)}" if store.is_absolute() and store.is_relative_to(home) else str(store)


@dataclass
class OnlineFeatures:
    """Online: features computed per micro-batch by `target` (frozen, on the head's device)."""

    records: TokenRecords
    target: nn.Module
    feature_layers: list[int]  # as data_prep stores them: HF hidden_states indices, -1 = the last (normed)

    def fill(self, batch: Batch) -> Batch:
        """`batch` (ids on the target's device) with the target's features; zeros on padding, as collated
        from a store. The forward runs in inference mode; masked_fill copies its outputs out of it."""
        ids = batch.input_ids  # [B, S]
        valid = torch.arange(ids.shape[1], device=ids.device) < batch.lengths.to(ids.device)[:, None]  # [B, S]
        last, aux = target_features(self.target, ids, valid.long(), self.feature_layers)  # [B, S, H], [B, S, K*H]
        padding = ~valid[..., None]  # [B, S, 1]
        hidden = last.masked_fill(padding, 0)
        aux = None if aux is None else aux.masked_fill(padding, 0)
        return Batch(ids, batch.loss_mask, hidden, batch.lengths, aux)

    def check(self, draft: DraftConfig, target: str) -> None:
        pass  # the head's sizes and layers come from this very target and config

    @property
    def tokens(self) -> int:
        return self.records.num_tokens

    def describe(self) -> str:
        return "online: features from the target during training"


def open_features(cfg, prep: PrepConfig, target: TargetFiles, device: torch.device) -> StoreFeatures | OnlineFeatures:
    """The source `cfg.train.features` names; online tokenizes the data of `prep` with the job's
    resolved `target` and loads the target here."""
    kind = str(cfg.train.features)
    if kind == "online":
        records = token_records(prep, target)
        model = load_target(target.folder, fast_dtype(prep.model.dtype, device), device)
        return OnlineFeatures(records, model, [int(i) for i in prep.model.feature_layers])
    return StoreFeatures(FeatureStore(cfg.store_dir), str(cfg.store_dir))
