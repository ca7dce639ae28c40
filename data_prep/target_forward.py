"""Run the frozen target over tokenized records in length-bucketed batches.

Feature layers index `hidden_states` as HF returns it (eagle/heads/feature_layers.py); -1 is the
last one *after* the final norm, the EAGLE-1/2 feature. With only [-1] requested, the decoder
is called directly (no hidden states of other layers, no `lm_head` over the vocabulary).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from data_prep.shard_buffer import ShardBuffer
from eagle.heads.feature_layers import fused_layers


def bucket_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Group indices by length so a padded batch stays within `batch_tokens` tokens.

    Sorted longest first; a batch grows while (rows + 1) × its longest row still fits.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= batch_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def pad_batch(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token lists: ids [B, S] and attention mask [B, S]."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, s in enumerate(seqs):
        ids[row, : len(s)] = torch.tensor(s)
        attn[row, : len(s)] = 1
    return ids, attn


@torch.inference_mode()
def target_features(model, ids: torch.Tensor, attn: torch.Tensor, feature_layers: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Last-layer features [B, S, H] and, for extra layers, [B, S, K*H] (else None)."""
    extra = fused_layers(feature_layers)
    decoder = model.get_decoder()
    out = decoder(input_ids=ids, attention_mask=attn, use_cache=False, output_hidden_states=bool(extra))
    last = out.last_hidden_state  # [B, S, H], post final norm
    if not extra:
        return last, None
    return last, torch.cat([out.hidden_states[i] for i in extra], dim=-1)


def compute_records(
    model,
    tokenized: list[tuple[list[int], list[int]]],
    feature_layers: list[int],
    batch_tokens: int,
    pad_id: int,
    on_batch=None,
    dtype: torch.dtype | None = None,
) -> ShardBuffer:
    """The shard of `tokenized` (records in input order), computed in length-bucketed batches.

    Each record's rows are copied from the batch's output straight into their slice of one
    preallocated ShardBuffer (features in `dtype`, default the target's), so the shard is held
    once. On a GPU the copies are asynchronous, into page-locked memory: the loop queues the next
    batch's forward at once, and the buffer is sealed after the last copy (the writer waits for it)."""
    device = next(model.parameters()).device
    shard = ShardBuffer([len(ids) for ids, _ in tokenized], pin=device.type == "cuda")
    for batch in bucket_batches([len(t[0]) for t in tokenized], batch_tokens):
        ids, attn = pad_batch([tokenized[i][0] for i in batch], pad_id)  # [B, S]
        last, aux = target_features(model, ids.to(device), attn.to(device), feature_layers)  # [B, S, H], [B, S, K*H]
        for row, i in enumerate(batch):
            n = len(tokenized[i][0])
            mask = torch.tensor(tokenized[i][1], dtype=torch.uint8)  # [n]
            shard.put(i, ids[row, :n], mask, last[row, :n], None if aux is None else aux[row, :n], dtype)
        if on_batch is not None:
            on_batch(sum(len(tokenized[i][0]) for i in batch), len(batch))
    shard.seal()
    return shard


def iter_batches(tokenized: list[list[int]], batch_tokens: int, pad_id: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The padded batches `compute_records` runs, for timing a bare forward over them."""
    for batch in bucket_batches([len(t) for t in tokenized], batch_tokens):
        yield pad_batch([tokenized[i] for i in batch], pad_id)
