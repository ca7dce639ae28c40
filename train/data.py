"""Batches of (feature, next token, next feature) pairs from a memory-mapped feature store.

A record of S tokens gives S-1 training pairs: position t takes (f_t, x_{t+1}) and
predicts f_{t+1}; pair t counts in the loss iff loss_mask[t+1] is set. A batch keeps the
S rows of each record (the pairs are formed by shifting in the loss step), right-padded to
the longest record of the batch. With causal attention, right padding never changes the
real positions, so no attention mask is needed; padded rows have loss_mask 0.

Batching is length-aware: records are sorted by length (random tie order) and grouped so
that padded length x records stays within `batch_tokens`; the batch order is then shuffled.
Everything depends only on (seed, epoch), so a resumed run sees the same batches.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.utils.data import DataLoader, Dataset

from data_prep.store import FeatureStore, Record

if TYPE_CHECKING:
    from data_prep.tokens import TokenRecords


@dataclass
class Batch:
    """Right-padded records. S = longest record in the batch."""

    input_ids: torch.Tensor  # [B, S] int64, pad 0
    loss_mask: torch.Tensor  # [B, S] bool, False on padding
    hidden: torch.Tensor | None  # [B, S, H] store dtype, zeros on padding (None until online features fill it)
    lengths: torch.Tensor  # [B] int64
    aux: torch.Tensor | None = None  # [B, S, K*H] the extra layers (EAGLE-3 stores), zeros on padding

    def to(self, device) -> "Batch":
        """The tensors on `device` (lengths stay on the CPU: they only count pairs)."""
        hidden, aux = (None if t is None else t.to(device, non_blocking=True) for t in (self.hidden, self.aux))
        return Batch(self.input_ids.to(device), self.loss_mask.to(device), hidden, self.lengths, aux)

    def pin_memory(self) -> "Batch":
        """Page-locked copies (DataLoader calls this with pin_memory=True): asynchronous copies to a GPU."""
        hidden, aux = (None if t is None else t.pin_memory() for t in (self.hidden, self.aux))
        return Batch(self.input_ids.pin_memory(), self.loss_mask.pin_memory(), hidden, self.lengths, aux)

    @property
    def num_pairs(self) -> int:
        """Real (unpadded) training pairs in the batch."""
        return int((self.lengths - 1).clamp(min=0).sum())


def collate(records: Sequence[Record]) -> Batch:
    """Pad records on the right into one Batch (records without features: hidden None)."""
    lengths = torch.tensor([len(r.input_ids) for r in records], dtype=torch.int64)
    b, s = len(records), int(lengths.max())
    input_ids = torch.zeros(b, s, dtype=torch.int64)
    loss_mask = torch.zeros(b, s, dtype=torch.bool)
    hidden, aux = (_zeros(b, s, [getattr(r, key) for r in records]) for key in ("hidden_states", "aux_hidden_states"))
    for i, r in enumerate(records):
        n = len(r.input_ids)
        input_ids[i, :n] = r.input_ids
        loss_mask[i, :n] = r.loss_mask.bool()
        for padded, rows in ((hidden, r.hidden_states), (aux, r.aux_hidden_states)):
            if padded is not None:
                padded[i, :n] = rows
    return Batch(input_ids, loss_mask, hidden, lengths, aux)


def _zeros(b: int, s: int, parts: list[torch.Tensor | None]) -> torch.Tensor | None:
    """[B, S, W] zeros in the dtype of `parts` ([S_i, W] each), or None when the records have none."""
    return None if parts[0] is None else torch.zeros(b, s, parts[0].shape[-1], dtype=parts[0].dtype)


class RecordDataset(Dataset):
    """Map-style view of a FeatureStore (records read from the mmapped shards on access) or of
    TokenRecords (online training: tokens only)."""

    def __init__(self, store: FeatureStore | TokenRecords):
        self.store = store

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, i: int) -> Record:
        return self.store[i]


def split_indices(lengths: Sequence[int], eval_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Deterministic (train, eval) split of the usable records (>= 2 tokens) by `seed`."""
    usable = [i for i, n in enumerate(lengths) if n >= 2]
    order = list(usable)
    random.Random(f"split-{seed}").shuffle(order)
    n_eval = math.ceil(eval_fraction * len(order)) if eval_fraction > 0 else 0
    n_eval = min(n_eval, len(order) - 1)
    return sorted(order[n_eval:]), sorted(order[:n_eval])


def length_batches(
    indices: Sequence[int], lengths: Sequence[int], batch_tokens: int, seed: int | None
) -> list[list[int]]:
    """Group record indices into batches with padded size <= batch_tokens.

    seed None keeps a fixed order (evaluation); otherwise ties in length and the order of
    batches are shuffled by seed. A record longer than the budget forms a batch alone.
    """
    order = list(indices)
    rng = random.Random(seed) if seed is not None else None
    if rng is not None:
        rng.shuffle(order)  # random order among records of equal length
    order.sort(key=lambda i: lengths[i])  # stable sort
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = lengths[i]  # sorted ascending: the newcomer is the longest
        if current and longest * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    if rng is not None:
        rng.shuffle(batches)
    return batches


class BatchPlan:
    """The micro-batches of one rank, epoch after epoch, addressable by micro-step.

    Each epoch's batch list is cut to a multiple of the world size and dealt round-robin,
    so every rank has the same number of micro-batches per epoch.
    """

    def __init__(self, indices: Sequence[int], lengths: Sequence[int], batch_tokens: int,
                 seed: int, rank: int = 0, world_size: int = 1):
        self.indices, self.lengths = list(indices), list(lengths)
        self.batch_tokens, self.seed = batch_tokens, seed
        self.rank, self.world_size = rank, world_size
        self.per_epoch = len(self.epoch(0))
        if self.per_epoch == 0:
            raise ValueError(
                f"{len(self.indices)} training records make fewer batches than ranks ({world_size}): "
                "use more data or a smaller train.batch_tokens"
            )

    def epoch(self, e: int) -> list[list[int]]:
        """This rank's micro-batches (record indices) of epoch e."""
        batches = length_batches(self.indices, self.lengths, self.batch_tokens, seed=hash_seed(self.seed, e))
        usable = len(batches) - len(batches) % self.world_size
        return batches[self.rank:usable:self.world_size]

    def from_step(self, micro_step: int) -> Iterator[list[int]]:
        """Endless micro-batches starting at global micro-step `micro_step`."""
        e, i = divmod(micro_step, self.per_epoch)
        while True:
            yield from self.epoch(e)[i:]
            e, i = e + 1, 0


def hash_seed(seed: int, epoch: int) -> int:
    """Per-epoch shuffle seed, stable across Python processes (unlike hash())."""
    return seed * 1_000_003 + epoch


def loader(store: FeatureStore | TokenRecords, batches: Iterator[list[int]] | list[list[int]], num_workers: int = 0,
           pin_memory: bool = False) -> DataLoader:
    """A DataLoader that yields collated Batches for the given index lists, in order.

    num_workers > 0 gathers and pads the next batches in worker processes while the GPU works
    (each prefetches 4); pin_memory makes their host-to-device copies asynchronous."""
    extra = {"prefetch_factor": 4} if num_workers > 0 else {}
    return DataLoader(
        RecordDataset(store), batch_sampler=batches, collate_fn=collate, num_workers=num_workers,
        pin_memory=pin_memory, persistent_workers=False, **extra,
    )


def loader_settings(num_workers: int | None, device: torch.device, online: bool = False) -> tuple[int, bool]:
    """(workers, pin_memory) for train.num_workers on `device`: null means 4 workers with pinned
    memory on a GPU (a 7B target's micro-batch is 64-256 MB of features), none on a CPU, where
    the training step and the loader share the same cores, and none online, where a batch is
    only token ids already in memory."""
    cuda = device.type == "cuda"
    if num_workers is None:
        num_workers = 4 if cuda and not online else 0
    return num_workers, cuda
