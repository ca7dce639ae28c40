"""Whether the ranks share output_dir, or each node has a folder of its own; checkpoints follow.

    layout = output_layout(output_dir)   # collective: Layout("shared" | "node-local", writer)
    use_layout(cfg, layout)              # DeepSpeed's checkpoint.use_node_local_storage follows it

shared: every rank sees one folder (a filesystem every node mounts, or one machine). Rank 0 writes
the model states, the completion marker and `latest` (train/checkpoints.py); each rank its ZeRO
partition.

node-local: the ranks of a node see one folder that the other nodes' ranks do not (each node's own
disk, at the same path or not). Each node's first rank writes the model states, the marker and
`latest` into its node's folder, and each rank its ZeRO partition there: a node's folder holds what
its ranks load, so a resume reads nothing from another node, and starts from the newest checkpoint
that is whole on every node. The exported head and W&B files go to rank 0's folder only.

Anything in between (some nodes share the folder, others do not) is refused on every rank with
one line. How it is found: the first rank of each node writes a marker named by a token of rank 0,
then every rank says which nodes' markers it sees (waiting `patience_s` for a network
filesystem's lookups); all of them = shared, only its own node's = node-local.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from eagle.common import distributed

NODE_LOCAL = "use_node_local_storage"


@dataclass(frozen=True)
class Layout:
    kind: str  # "shared" | "node-local"
    writer: bool  # does this rank write the folder's run-wide files (lock, marker, latest)?


def output_layout(path: str | Path, patience_s: float = 5.0) -> Layout:
    """How the ranks see `path` (created if missing). Collective: call on every rank."""
    path = Path(path).resolve()
    path.mkdir(parents=True, exist_ok=True)
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return Layout("shared", True)
    rank = dist.get_rank()
    nodes = _gathered((_node(), uuid.uuid4().hex), "the nodes of output_dir's ranks")  # (node, token) per rank
    token, nodes = nodes[0][1], [node for node, _ in nodes]  # rank 0's token names this check's markers
    order = list(dict.fromkeys(nodes))  # nodes in order of their first rank
    index = [order.index(n) for n in nodes]  # node index of every rank
    first = nodes.index(nodes[rank]) == rank
    marker = lambda i: path / f".layout-{token}-{i}"  # noqa: E731
    if first:
        marker(index[rank]).write_text(nodes[rank])
    distributed.barrier("the markers of output_dir's layout")
    deadline = time.monotonic() + patience_s
    seen = {i for i in range(len(order)) if marker(i).exists()}
    while len(seen) < len(order) and time.monotonic() < deadline:
        time.sleep(0.5)
        seen = {i for i in range(len(order)) if marker(i).exists()}
    views = _gathered(sorted(seen), "what each rank sees of output_dir")
    if first:
        marker(index[rank]).unlink(missing_ok=True)
    if all(len(v) == len(order) for v in views):
        return Layout("shared", rank == 0)
    if all(v == [index[r]] for r, v in enumerate(views)):
        return Layout("node-local", first)
    r = next((r for r, v in enumerate(views) if v != [index[r]]), 0)
    raise ValueError(f"output_dir={path}: some nodes share it and others do not: rank {r} on {nodes[r]} sees the "
                     f"folder of {len(views[r])} of {len(order)} nodes; give each node a folder of its own, or put "
                     "output_dir on a filesystem every node mounts")


def use_layout(cfg: DictConfig, layout: Layout) -> None:
    """Set the DeepSpeed config's checkpoint.use_node_local_storage to what `layout` needs (in cfg)."""
    checkpoint = cfg.deepspeed.get("checkpoint") or {}
    if layout.kind == "node-local" or NODE_LOCAL in checkpoint:
        OmegaConf.update(cfg, f"deepspeed.checkpoint.{NODE_LOCAL}", layout.kind == "node-local", force_add=True)


def _node() -> str:
    """This rank's node: the host, and torchrun's node rank when it sets one (two nodes may be one host)."""
    group = os.environ.get("GROUP_RANK")
    return socket.gethostname() + (f" (node rank {group})" if group is not None else "")


def _gathered(value, what: str) -> list:
    """Every rank's value, in rank order."""
    seen = distributed.merged({dist.get_rank(): value}, what)
    return [seen[r] for r in range(dist.get_world_size())]
