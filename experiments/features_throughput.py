"""Data-prep throughput against a bare target forward over the same batches, in one process.

    python -m experiments.features_throughput +model=smollm2_135m data.limit=200

Builds a store in a temporary directory (timing the whole shard loop: tokenization,
forward, copies, writing, hashing), then times the target's decoder alone over exactly the
padded batches the pipeline ran. Prints tokens/s of each and their ratio; repeats the pair
`repeats` times and reports medians, since this machine is noisy.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from data_prep import pipeline
from data_prep.conversations import read_conversations
from data_prep.target_forward import iter_batches
from data_prep.resolvers import register_resolvers
from data_prep.store import read_manifest
from data_prep.template import tokenize_chunk
from eagle.common.precision import fast_dtype
from eagle.targets.resolve import load_target, resolve_target
from eagle.targets.tokenizer import load_tokenizer


def bare_forward_tokens_per_s(cfg: DictConfig) -> float:
    """Tokens/s of the decoder alone over the batches the pipeline forms."""
    target_dir = resolve_target(cfg.model.path)
    tokenizer = load_tokenizer(target_dir, cfg.model.chat_template)
    conversations, _ = read_conversations(cfg.data.source, cfg.data.limit)
    R = cfg.data.shard_records
    seqs_by_shard = []
    for k in range(-(-len(conversations) // R)):
        tokenized, _ = tokenize_chunk(tokenizer, conversations[k * R:(k + 1) * R], cfg.model.max_len)
        seqs_by_shard.append([ids for ids, _ in tokenized])
    model = load_target(target_dir, fast_dtype(cfg.model.dtype))  # as the pipeline runs it
    decoder = model.get_decoder()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    batches = [b for seqs in seqs_by_shard for b in iter_batches(seqs, cfg.data.batch_tokens, pad)]
    tokens = sum(int(attn.sum()) for _, attn in batches)
    start = time.perf_counter()
    with torch.inference_mode():
        for ids, attn in batches:
            decoder(input_ids=ids, attention_mask=attn, use_cache=False)
    return tokens / (time.perf_counter() - start)


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    repeats = int(cfg.get("repeats", 3))
    rows = []
    for r in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            run = OmegaConf.merge(cfg, {"store_dir": tmp})
            pipeline.prepare(run)
            prep = read_manifest(tmp)["throughput"]["tokens_per_s"]
        bare = bare_forward_tokens_per_s(cfg)
        rows.append({"prep_tok_s": prep, "bare_tok_s": round(bare, 1), "ratio": round(prep / bare, 3)})
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({
        "median_prep_tok_s": statistics.median(r["prep_tok_s"] for r in rows),
        "median_bare_tok_s": statistics.median(r["bare_tok_s"] for r in rows),
        "median_ratio": statistics.median(r["ratio"] for r in rows),
    }))


if __name__ == "__main__":
    register_resolvers()
    main()
