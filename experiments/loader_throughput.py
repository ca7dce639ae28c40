"""Does the input pipeline keep up with a 7B target's head? Loader tokens/s against a bare step.

    python -m experiments.loader_throughput [--hidden 4096] [--records 48] [--workers 0,2,4]

Writes a synthetic feature store of `--hidden`-wide bf16 features (records of 512-2048 tokens,
as a 7B target's store holds) to a temporary folder, then measures in one process:
- the trainer's loader (train.data: memory-mapped shards -> padded micro-batches of
  `--batch-tokens`) with each worker count, in tokens/s and MB/s;
- a bare forward + backward of an EAGLE-2 head of that width on the same micro-batches
  (this machine's device, bf16).
The loader keeps up when its rate exceeds the step's; on a GPU the step is far faster than on
this CPU, so the loader's absolute rate is the figure to compare with a GPU's step rate.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from data_prep.store import FeatureStore, Record, new_manifest, shard_name, write_manifest, write_shard
from eagle.heads.checkpoint import build_head
from eagle.heads.eagle2 import DraftConfig
from train.data import length_batches, loader
from train.loss import eagle_loss, make_pairs


def synthetic_store(directory: Path, hidden: int, records: int, seed: int = 0, per_shard: int = 16) -> FeatureStore:
    """A complete store of random bf16 features [L, hidden], L uniform in 512..2048."""
    g = torch.Generator().manual_seed(seed)
    shards = []
    for k, start in enumerate(range(0, records, per_shard)):
        out = []
        for _ in range(min(per_shard, records - start)):
            n = int(torch.randint(512, 2049, (1,), generator=g))
            out.append(Record(input_ids=torch.randint(0, 32000, (n,), generator=g),
                              loss_mask=torch.ones(n, dtype=torch.uint8),
                              hidden_states=torch.randn(n, hidden, generator=g).to(torch.bfloat16)))
        shards.append(write_shard(directory / shard_name(k), out, hidden_size=hidden, dtype=torch.bfloat16))
    target = {"name": "synthetic", "path": "", "hidden_size": hidden, "vocab_size": 32000, "num_layers": 32,
              "dtype": "torch.bfloat16", "feature_layers": [-1]}
    source = {"data": "random", "read": records, "kept": records, "skipped": {}}
    write_manifest(directory, new_manifest(target, source, shards, complete=True, chat_template_sha256=""))
    return FeatureStore(directory)


def loader_rate(store: FeatureStore, batches: list[list[int]], workers: int) -> dict:
    """Tokens/s and MB/s of padded micro-batches delivered by the trainer's loader."""
    tokens = nbytes = 0
    start = time.perf_counter()
    for batch in loader(store, batches, workers):
        tokens += int(batch.lengths.sum())
        nbytes += batch.hidden.numel() * batch.hidden.element_size()
    seconds = time.perf_counter() - start
    return {"workers": workers, "tokens_per_s": round(tokens / seconds), "MB_per_s": round(nbytes / seconds / 2**20)}


def step_rate(store: FeatureStore, batches: list[list[int]], hidden: int) -> dict:
    """Tokens/s of a bare forward + backward of a `hidden`-wide EAGLE-2 head (lm_head: 32000 rows)."""
    cfg = DraftConfig(hidden_size=hidden, intermediate_size=int(hidden * 2.6875), num_attention_heads=max(1, hidden // 128),
                      num_key_value_heads=max(1, hidden // 128), vocab_size=32000)
    head = build_head(cfg).to(torch.bfloat16)
    lm_head = torch.randn(32000, hidden, dtype=torch.bfloat16) * 0.02
    embed = torch.nn.Embedding(32000, hidden).to(torch.bfloat16)
    tokens = 0
    start = time.perf_counter()
    for batch in loader(store, batches):
        p = make_pairs(batch.input_ids, batch.loss_mask, batch.hidden)
        pred, _ = head(p.features, embed(p.next_ids), p.position_ids)
        eagle_loss(pred, p.target, p.mask, lm_head).loss.backward()
        tokens += int(batch.lengths.sum())
    return {"tokens_per_s": round(tokens / (time.perf_counter() - start)), "params_M": round(
        sum(x.numel() for x in head.parameters()) / 1e6)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m experiments.loader_throughput", description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--records", type=int, default=48)
    ap.add_argument("--batch-tokens", type=int, default=8192, help="EAGLE: 4 sequences x 2048")
    ap.add_argument("--workers", default="0,2,4")
    ap.add_argument("--step-batches", type=int, default=2, help="micro-batches the bare step is timed on")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="eagle-loader-") as tmp:
        store = synthetic_store(Path(tmp), args.hidden, args.records)
        batches = length_batches(range(len(store)), store.lengths(), args.batch_tokens, seed=0)
        result = {"hidden": args.hidden, "batches": len(batches),
                  "MB_per_batch": round(args.batch_tokens * args.hidden * 2 / 2**20),
                  "loader": [loader_rate(store, batches, int(w)) for w in args.workers.split(",")],
                  "bare_step": step_rate(store, batches[: args.step_batches], args.hidden)}
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
