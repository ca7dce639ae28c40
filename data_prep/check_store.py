"""Check a feature store against its target: `python -m data_prep.check_store STORE [--records 5]`.

For a few random records: recompute the target's features over the stored `input_ids` in a
fresh single-sequence forward and report the max abs difference to the stored ones (expect
bf16 rounding: a few units of 2^-8 relative), and print the loss-masked tokens decoded (expect
assistant text and end-of-turn markers only). Also re-hashes every shard against the manifest.
"""

from __future__ import annotations

import argparse
import random
import sys

import torch

from data_prep.store import FeatureStore, sha256_file
from eagle.targets.resolve import resolve_target
from eagle.targets.tokenizer import load_tokenizer


def check_hashes(store: FeatureStore) -> list[str]:
    """Names of shards whose bytes no longer match the manifest."""
    return [s["file"] for s in store.manifest["shards"] if sha256_file(store.dir / s["file"]) != s["sha256"]]


@torch.inference_mode()
def feature_error(model, record, dtype: torch.dtype) -> tuple[float, float]:
    """(max abs difference, max abs stored value) between stored and fresh features."""
    fresh = model.get_decoder()(input_ids=record.input_ids[None]).last_hidden_state[0]
    stored = record.hidden_states.to(fresh.dtype)
    return float((fresh.float() - stored.float()).abs().max()), float(stored.float().abs().max())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m data_prep.check_store", description=__doc__.split("\n\n")[0])
    p.add_argument("store")
    p.add_argument("--records", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--show-chars", type=int, default=300, help="characters of masked text to print per record")
    args = p.parse_args(argv)
    from transformers import AutoModelForCausalLM

    store = FeatureStore(args.store)
    target = store.manifest["target"]
    path = resolve_target(target["path"])
    dtype = getattr(torch, target["dtype"])
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
    tokenizer = load_tokenizer(path)
    bad = check_hashes(store)
    print(f"{len(store)} records in {len(store.manifest['shards'])} shards; sha256 mismatches: {bad or 'none'}")
    worst = 0.0
    for i in random.Random(args.seed).sample(range(len(store)), min(args.records, len(store))):
        rec = store[i]
        err, scale = feature_error(model, rec, dtype)
        worst = max(worst, err)
        masked = tokenizer.decode(rec.input_ids[rec.loss_mask])
        print(f"record {i}: {len(rec.input_ids)} tokens, {int(rec.loss_mask.sum())} masked; "
              f"max |fresh - stored| = {err:.4g} (max |feature| {scale:.3g})")
        print(f"  masked text: {masked[:args.show_chars]!r}{' ...' if len(masked) > args.show_chars else ''}")
    print(f"worst max abs difference: {worst:.4g}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
