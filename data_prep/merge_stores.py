"""One feature store made of several finished ones, by linking their shards: no target forward.

    python -m data_prep.merge_stores OUT STORE [STORE ...]

Slices of data prepared one at a time (`data.offset`, `data.limit`) become one store to train several
epochs over, in the order given. Each shard is hard-linked into OUT (copied where the filesystem cannot
link) under its new number, with its manifest entry (hash included); the manifest lists the stores it
came from and is written last, so an interrupted merge is simply run again. The stores must come from
the same target run the same way (model, dtype, stored layers, max_len, hidden size, chat template,
batch budget); a store that differs is named with the field. Train on OUT with `store_dir=OUT`.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

from data_prep.reuse import SAME_TARGET, Donor, link_shard
from data_prep.store import FORMAT_VERSION, read_manifest, shard_name, write_manifest

AGREE = ("format_version", "chat_template_sha256")  # besides the target's fields of SAME_TARGET and batch_tokens


def merge_stores(out: Path, stores: list[Path]) -> dict:
    """Link the shards of `stores`, in order, into `out`; its manifest."""
    manifests = [_complete(s) for s in stores]
    first = manifests[0]
    for store, m in zip(stores[1:], manifests[1:]):
        _check_same(stores[0], first, store, m)
    out.mkdir(parents=True, exist_ok=True)
    existing = read_manifest(out)
    if existing is not None and not _merged_from(existing, stores):
        raise ValueError(f"{out}: already holds a store that was not merged from these; choose another folder")
    entries = []
    for store, m in zip(stores, manifests):
        for entry in m["shards"]:
            dst = out / shard_name(len(entries))
            entries.append(link_shard(Donor(store / entry["file"], entry, None), dst))
    manifest = {
        "format_version": FORMAT_VERSION,
        "chat_template_sha256": first["chat_template_sha256"],
        "config_key": "merged-" + hashlib.sha256(" ".join(m["config_key"] for m in manifests).encode()).hexdigest()[:16],
        "target": first["target"],
        "source": {"merged": [{"store": str(s), "tokens": m["tokens"], "source": m.get("source")}
                              for s, m in zip(stores, manifests)]},
        "records": sum(m["records"] for m in manifests),
        "tokens": sum(m["tokens"] for m in manifests),
        "loss_tokens": sum(m["loss_tokens"] for m in manifests),
        "shards": entries,
        "expected_shards": len(entries),
        "complete": True,
    }
    write_manifest(out, manifest)
    return manifest


def _complete(store: Path) -> dict:
    m = read_manifest(store)
    if m is None or not m.get("complete"):
        raise ValueError(f"{store}: not a complete feature store (run data_prep into it first)")
    return m


def _check_same(a: Path, ma: dict, b: Path, mb: dict) -> None:
    """Stop, naming the field, when store b was not made by the same target run as store a."""
    fields = [(k, ma.get(k), mb.get(k)) for k in AGREE]
    fields += [(f"target.{k}", ma["target"].get(k), mb["target"].get(k)) for k in (*SAME_TARGET, "batch_tokens")]
    for name, x, y in fields:
        if x != y:
            raise ValueError(f"{b}/manifest.json: {name} is {y!r}, but {a} has {x!r}: stores of different "
                             "target runs cannot be merged")


def _merged_from(manifest: dict, stores: list[Path]) -> bool:
    merged = (manifest.get("source") or {}).get("merged") or []
    return [m.get("store") for m in merged] == [str(s) for s in stores]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="the new store's folder")
    parser.add_argument("stores", type=Path, nargs="+", help="complete stores, in the order to read them")
    args = parser.parse_args(argv)
    m = merge_stores(args.out, args.stores)
    print(f"{args.out}: {len(m['shards'])} shards, {m['records']} records, {m['tokens']} tokens from "
          f"{len(args.stores)} stores")


if __name__ == "__main__":
    main()
