"""Our C++ attention for compiled forwards on a CPU (`EAGLE_ATTENTION`): a decode step's few query rows over
the KV cache bucket, each under its own mask row.

    if attention_kernel.applies(query, key, mask):        # CPU, batch 1, fp32 or bf16, kernel built
        out = attention_kernel.masked_attention(query, key, value, mask, scale)   # [1, r, H, D]

A compiled forward attends over its whole cache bucket (256 · 2^i rows) under a mask that hides the rows past
the context. PyTorch's CPU flash kernel reads every one of them and splits its work by heads (3 key/value heads of
the embedded default for 2 threads); a verify's 30 attentions took ~170 µs each, ~8 % of the forward on a 2-core
Xeon. The kernel (eagle/compiled/csrc/masked_attention.cpp) skips the hidden columns, reads each key and value once
for the query heads that share it and splits by (key/value head, row). The sums run in another order than
PyTorch's, so an fp32 greedy decoding may part from eager decoding only at a near-tie (as with the GEMV).

`EAGLE_ATTENTION=auto` (the default): on wherever the kernel builds; `0`: PyTorch's SDPA. The kernel is built at a
graph's first compile (`ensure_built`, ~20 s at a machine's first use, eagle/common/native_build.py); a forward
traced before that, or an eager forward under `defer`, takes it only once built.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from functools import cache
from pathlib import Path

import torch

from eagle.common.env_choice import env_choice
from eagle.common.native_build import optional_extension

log = logging.getLogger("eagle")
SOURCE = Path(__file__).resolve().parent / "csrc" / "masked_attention.cpp"
CHOICES = ("auto", "0")  # EAGLE_ATTENTION
DTYPES = (torch.float32, torch.bfloat16)
_BUILDING = threading.Lock()
_built = False


def wanted() -> bool:
    """EAGLE_ATTENTION, checked: whether compiled forwards should take the kernel."""
    return env_choice("EAGLE_ATTENTION", "auto", CHOICES) == "auto"


def ensure_built() -> bool:
    """Build and register the kernel where `wanted` (the first caller builds, the others wait); whether it is there."""
    if not wanted():
        return False
    with _BUILDING:
        return _build() is not None


def ready() -> bool:
    """Wanted and built already (never builds: a forward's trace asks this)."""
    return _built and wanted()


def applies(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether this call can take the kernel: built, on the CPU, one sequence under one mask, all in fp32 or all bf16."""
    return (ready() and mask is not None and query.device.type == "cpu" and query.shape[0] == 1
            and mask.shape[:2] == (1, 1) and query.dtype in DTYPES
            and query.dtype == key.dtype == mask.dtype)


def masked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """query [1, H, r, D] over key/value [1, Hk, L, D] under the additive mask [1, 1, r, L]; [1, r, H, D]."""
    return torch.ops.eagle.masked_attention(query, key, value, mask, scale)


def key() -> str:
    """What compiled graphs and their timings depend on: the kernel's source where it is wanted (inductor's cache key,
    tree budgets; known before it is built, so a key computed at loading matches the one after)."""
    return "attn-" + _source_digest() if wanted() else "sdpa"


@cache
def _source_digest() -> str:
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]


@cache
def _build():
    global _built
    log.info("loading the attention kernel (%s; built at a machine's first use, ~20 s)", SOURCE.name)
    ext = optional_extension("eagle_masked_attention", SOURCE, log, "attention stays on SDPA")
    if ext is None:
        return None
    torch.library.register_fake("eagle::masked_attention")(_fake)
    _built = True
    return ext


def _fake(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
          scale: float) -> torch.Tensor:
    return query.new_empty(query.shape[0], query.shape[2], query.shape[1], query.shape[3])
