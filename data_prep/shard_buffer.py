"""One shard's tensors, allocated once at their final size and filled in place record by record.

    shard = ShardBuffer(lengths, pin=on_cuda)      # ids, mask and offsets now; features at the first put
    shard.put(i, ids, mask, hidden, aux, dtype)    # record i's rows (features may still be on the GPU)
    shard.seal()                                   # after the last put: marks when the GPU copies land
    shard.wait(); shard.tensors(hidden_size, dtype)  # the writer: the flat tensors of the store format

The store format (data_prep/store.py) keeps a shard's records as flat tensors; building them from
per-record copies and concatenating held each shard twice in host memory. Here every record's
rows go straight into their slice. With `pin=True` (a CUDA target) the feature tensors are
page-locked and filled by asynchronous device-to-host copies, so the next batch's forward is queued
while they run; `seal` records a CUDA event after the last copy and `wait` (the writer, before it
reads the memory) waits for it.
"""

from __future__ import annotations

import torch


class ShardBuffer:
    """input_ids [T] int32, loss_mask [T] uint8, offsets [N+1] int64, hidden_states [T, H] and
    aux_hidden_states [T, K*H] (EAGLE-3's extra layers; else None) of one shard."""

    def __init__(self, lengths: list[int], pin: bool = False):
        self.offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)  # [N+1]
        self.offsets[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
        rows = int(self.offsets[-1])
        self.input_ids = torch.empty(rows, dtype=torch.int32)  # [T]
        self.loss_mask = torch.empty(rows, dtype=torch.uint8)  # [T]
        self.hidden_states: torch.Tensor | None = None  # [T, H], allocated at the first put
        self.aux_hidden_states: torch.Tensor | None = None  # [T, K*H]
        self.pin = pin
        self._copied = None  # CUDA event after the last asynchronous copy

    @classmethod
    def of_records(cls, records, dtype: torch.dtype) -> ShardBuffer:
        """The buffer of finished data_prep.store.Record objects (features in `dtype`)."""
        shard = cls([len(r.input_ids) for r in records])
        for i, r in enumerate(records):
            shard.put(i, r.input_ids, r.loss_mask, r.hidden_states, r.aux_hidden_states, dtype)
        return shard

    @property
    def records(self) -> int:
        return len(self.offsets) - 1

    @property
    def tokens(self) -> int:
        return int(self.offsets[-1])

    def put(self, i: int, input_ids: torch.Tensor, loss_mask: torch.Tensor, hidden: torch.Tensor,
            aux: torch.Tensor | None = None, dtype: torch.dtype | None = None) -> None:
        """Record i: input_ids [S], loss_mask [S], hidden [S, H], aux [S, K*H] (any device)."""
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        if self.hidden_states is None:
            self.hidden_states = self._features(hidden.shape[-1], dtype or hidden.dtype)
            if aux is not None:
                self.aux_hidden_states = self._features(aux.shape[-1], dtype or aux.dtype)
        self.input_ids[start:end].copy_(input_ids)
        self.loss_mask[start:end].copy_(loss_mask)
        self.hidden_states[start:end].copy_(hidden, non_blocking=self.pin)
        if aux is not None:
            self.aux_hidden_states[start:end].copy_(aux, non_blocking=self.pin)

    def _features(self, width: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(self.tokens, width, dtype=dtype, pin_memory=self.pin)  # [T, width]

    def seal(self) -> None:
        """Mark the end of the copies queued so far (on a GPU; nothing to mark on the CPU)."""
        if self.pin and torch.cuda.is_available():
            self._copied = torch.cuda.Event()
            self._copied.record()

    def wait(self) -> None:
        """Block until every copy into the buffer has landed (before reading it on the host)."""
        if self._copied is not None:
            self._copied.synchronize()

    def tensors(self, hidden_size: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The shard's tensors as stored: features in `dtype` (converted only if they are not),
        no aux_hidden_states in a shard without records."""
        hidden = self.hidden_states if self.hidden_states is not None else torch.zeros(0, hidden_size, dtype=dtype)
        out = {"input_ids": self.input_ids, "loss_mask": self.loss_mask, "hidden_states": hidden.to(dtype),
               "offsets": self.offsets}
        if self.records and self.aux_hidden_states is not None:
            out["aux_hidden_states"] = self.aux_hidden_states.to(dtype)
        return out
