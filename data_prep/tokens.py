"""The store's records without their features: what online training reads (train.features=online).

    records = token_records(prep, target)   # every rank: the same records, in the store's order
    records[i]                              # Record(input_ids [S], loss_mask [S], hidden_states=None)

`prep` is the job's PrepConfig and `target` its resolved target (data_prep/data_config.py). The
records are the ones `prepare(prep, target)` would write, in the same order: the same conversations
(read, and regenerated through the same reply cache in store_dir/regenerated), cut into the same
slices of `data.shard_records`, tokenized and masked by the same function
(`data_prep.template.tokenize_chunk`). Slice k is tokenized by rank k mod world, as data_prep
writes shard k, and every rank receives all of them. Nothing is written unless regeneration is on.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass

import torch

from eagle.common import distributed
from data_prep.conversations import DataError
from data_prep.data_config import PrepConfig, TargetFiles
from data_prep.pipeline import open_job, writing_store
from data_prep.store import Record
from data_prep.template import tokenize_chunk

log = logging.getLogger("data_prep")


@dataclass
class Packed:
    """One slice's records as flat tensors (5 bytes a token): what ranks exchange and keep."""

    input_ids: torch.Tensor  # [T] int32
    loss_mask: torch.Tensor  # [T] bool
    lengths: list[int]  # tokens per record, in order

    @classmethod
    def of(cls, records: list[tuple[list[int], list[int]]]) -> Packed:
        return cls(torch.tensor([t for ids, _ in records for t in ids], dtype=torch.int32),
                   torch.tensor([m for _, mask in records for m in mask], dtype=torch.bool),
                   [len(ids) for ids, _ in records])

    def records(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(input_ids, loss_mask) per record: views into the flat tensors."""
        return list(zip(self.input_ids.split(self.lengths), self.loss_mask.split(self.lengths), strict=True))


class TokenRecords:
    """Tokenized records in memory: the index side of a FeatureStore, with the same methods
    the trainer reads tokens through (`tokens`, `lengths`, `__getitem__`)."""

    def __init__(self, records: list[tuple[torch.Tensor, torch.Tensor]], source: dict):
        self.input_ids = [ids for ids, _ in records]  # [S_i] int32 each
        self.loss_masks = [mask for _, mask in records]  # [S_i] bool each
        self.source = source  # read, kept, skipped by reason: a manifest's "source" entry

    def __len__(self) -> int:
        return len(self.input_ids)

    def lengths(self) -> list[int]:
        return [len(ids) for ids in self.input_ids]

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths())

    def tokens(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids [S] long and loss_mask [S] bool of record i."""
        return self.input_ids[i].long(), self.loss_masks[i]

    def __getitem__(self, i: int) -> Record:
        input_ids, loss_mask = self.tokens(i)
        return Record(input_ids, loss_mask, None)


def token_records(prep: PrepConfig, target: TargetFiles) -> TokenRecords:
    """The records of `prep`'s store, tokens and masks only. Every rank of the group calls it."""
    rank, world = distributed.init()
    start = time.perf_counter()
    if prep.data.regenerate:  # the reply cache lives in the store folder, written by one job at a time
        with writing_store(prep.store_dir, rank):
            job = open_job(prep, target, rank, world)
    else:
        job = open_job(prep, target, rank, world)
    size = prep.data.shard_records
    n_slices = -(-len(job.conversations) // size)
    mine = {}
    for k in range(rank, n_slices, world):
        tokenized, skipped = tokenize_chunk(job.tokenizer, job.conversations[k * size:(k + 1) * size],
                                            prep.model.max_len, prep.data.mask_repeats)
        mine[k] = (Packed.of(tokenized), skipped)  # flat tensors: Python int lists would cost ~36 bytes a token
    slices = distributed.merged(mine)
    records = [r for k in range(n_slices) for r in slices[k][0].records()]
    skipped = Counter(job.source.get("skipped", {}))
    for k in range(n_slices):
        skipped.update(slices[k][1])
    source = {**job.source, "skipped": dict(sorted(skipped.items())), "kept": len(records)}
    if not records:
        reasons = ", ".join(f"{n} {why}" for why, n in skipped.most_common())
        raise DataError(str(prep.data.source), None, "", f"no usable conversation after tokenization: read "
                        f"{job.source.get('read')}, kept 0; skipped by reason: {reasons}")
    log.info("online: %d records (%d tokens) tokenized in %.1f s over %d rank(s)", len(records),
             sum(len(ids) for ids, _ in records), time.perf_counter() - start, world)
    return TokenRecords(records, source)
