"""A complete feature store is read-only: training may read one shared folder, or a copy of it on
each node's own disk (store_dir may then name a different folder on each node).

    ready = agree_on_store(store_dir)   # collective: True = read it; False = build it with data_prep

Every rank looks at its own store_dir and reduces what it finds to (state, digest): "complete"
with the digest of its manifest (format, config key, each shard's file name and SHA-256), or
"incomplete" / "missing". The ranks gather these and decide alike:

- every rank sees a complete store with the same digest: train from it, wherever it is;
- no rank sees a complete store: data_prep builds it, which needs one folder every rank sees
  (data_prep/pipeline.py refuses per-node folders in one line);
- otherwise (one copy missing, unfinished or of other data): every rank stops with one line
  naming a rank whose copy differs from rank 0's.

The digest compares what the manifests promise, not the bytes: a copy is checked as far as
FeatureStore checks it on opening (each shard's header and size). `python -m data_prep.check_store
DIR` re-hashes a copy's shards against its manifest.
"""

from __future__ import annotations

import hashlib
import json
import socket
from pathlib import Path

import torch.distributed as dist

from data_prep.store import read_manifest
from eagle.common import distributed


def store_state(store_dir: Path) -> tuple[str, str | None]:
    """("complete", digest) | ("incomplete", None) | ("missing", None) of the store this rank sees."""
    try:
        manifest = read_manifest(store_dir)
    except ValueError:  # a manifest cut short: an unfinished copy
        return "incomplete", None
    if manifest is None:
        return "missing", None
    if not manifest.get("complete"):
        return "incomplete", None
    promised = {"format": manifest.get("format_version"), "config_key": manifest.get("config_key"),
                "shards": [(s["file"], s["sha256"]) for s in manifest["shards"]]}
    return "complete", hashlib.sha256(json.dumps(promised, sort_keys=True).encode()).hexdigest()


def agree_on_store(store_dir: str | Path) -> bool:
    """True when every rank sees the same complete store, False when none sees one; else ValueError."""
    store_dir = Path(store_dir).resolve()
    mine = (*store_state(store_dir), socket.gethostname())
    views = [mine]
    if dist.is_initialized() and dist.get_world_size() > 1:
        seen = distributed.merged({dist.get_rank(): mine}, "the comparison of the ranks' stores")
        views = [seen[r] for r in range(dist.get_world_size())]
    if all(v[0] == "complete" and v[1] == views[0][1] for v in views):
        return True
    if not any(v[0] == "complete" for v in views):
        return False
    r = next(r for r, v in enumerate(views) if v[:2] != views[0][:2])
    raise ValueError(f"store_dir={store_dir} is not shared between the nodes, and the copies differ: rank {r} on "
                     f"{views[r][2]} finds {_describe(views[r])}, rank 0 on {views[0][2]} finds {_describe(views[0])}; "
                     "give every node the same complete store (copy the folder), or put store_dir on a filesystem "
                     "every node mounts")


def _describe(view: tuple) -> str:
    state, digest, _ = view
    return f"a complete store (manifest digest {digest[:12]})" if state == "complete" else f"the store {state}"
