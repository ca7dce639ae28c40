"""Tiny feature stores for tests and throughput checks, without data_prep or real data.

`write_tiny_store(model, directory)` runs a (tiny, random) causal LM over random token
sequences and writes the last hidden states in the store format of data_prep.store.
"""

from __future__ import annotations

from pathlib import Path

import torch

from data_prep.store import Record, new_manifest, shard_name, write_manifest, write_shard


@torch.no_grad()
def write_tiny_store(
    model,
    directory: str | Path,
    records: int = 48,
    min_len: int = 12,
    max_len: int = 48,
    prompt_len: int = 4,
    shard_records: int = 20,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    target_path: str = "",
    feature_layers: tuple[int, ...] = (-1,),
) -> Path:
    """Write a complete store of `records` random sequences; features = hidden_states[-1], and
    the other `feature_layers` (hidden_states indices) side by side as aux_hidden_states."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    out: list[Record] = []
    for _ in range(records):
        n = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        ids = torch.randint(3, cfg.vocab_size, (n,), generator=g)
        states = model(ids[None], output_hidden_states=True).hidden_states
        extra = [states[i][0] for i in feature_layers if i != -1]
        mask = torch.zeros(n, dtype=torch.uint8)
        mask[prompt_len:] = 1
        out.append(Record(input_ids=ids, loss_mask=mask, hidden_states=states[-1][0],  # [n, H]
                          aux_hidden_states=torch.cat(extra, dim=-1) if extra else None))  # [n, K*H]
    shards = [
        write_shard(directory / shard_name(k), out[i:i + shard_records], hidden_size=cfg.hidden_size, dtype=dtype)
        for k, i in enumerate(range(0, records, shard_records))
    ]
    target = {
        "name": "tiny-llama", "path": target_path, "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size, "num_layers": cfg.num_hidden_layers, "dtype": str(dtype),
        "feature_layers": list(feature_layers),
    }
    source = {"data": "random tokens", "read": records, "kept": records, "skipped": {}}
    write_manifest(directory, new_manifest(target, source, shards, complete=True, chat_template_sha256=""))
    return directory
