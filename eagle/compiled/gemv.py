"""Linear layers through our bf16 GEMV (`EAGLE_GEMV`), where a decode step's matmuls are bound by memory.

    routed = route_linears(target)     # its bias-free bf16 nn.Linear layers now call torch.ops.eagle.gemv_linear
    unroute_linears(target)            # back to nn.Linear

A decode step multiplies a few rows (1 for a plain step, a tree's nodes for a verify) by every weight once,
so it runs at the speed the weights are read. On a Zen 4 CPU (AVX512-BF16, no AMX) inductor's C++ GEMM
template and ATen's linear read them at 15-19 GB/s of the ~40 the memory streams; our kernel
(eagle/compiled/csrc/gemv_bf16.cpp: four output rows at a time, the input rows four at a time against the
same weights from L1) at ~31 (docs/speed.md). On a CPU with AMX a kernel of this kind lost to oneDNN inside
the compiled forward (docs/findings.md). Hence:

- `EAGLE_GEMV=auto` (the default): on where the CPU has AVX512-BF16 and no AMX;
- `EAGLE_GEMV=1`: on wherever the kernel builds (a CPU with AVX512-BF16); `EAGLE_GEMV=0`: off.

Only bias-free layers with bf16 weights on the CPU are routed (fp32 models keep ATen's matmuls and their
exact greedy equality with eager decoding; a bf16 sum in another order differs at near-ties only, as the
compiled graphs' template does). Routing swaps a layer's class for `GemvLinear` (same parameters, state dict
and `isinstance`), so graphs compiled afterwards call the op with the frozen weight, at any row count of a
dynamic graph. Rows past MAX_ROWS (a prompt) take ATen's linear inside the op, compute-bound there.
The kernel is built at a machine's first use (~15 s, eagle/common/native_build.py).
"""

from __future__ import annotations

import logging
import os
from functools import cache
from pathlib import Path

import torch
from torch import nn

from eagle.common.native_build import cpu_flags, native_extension

log = logging.getLogger("eagle")
SOURCE = Path(__file__).resolve().parent / "csrc" / "gemv_bf16.cpp"
MAX_ROWS = 64  # rows up to which the kernel runs; more take ATen's linear
CHOICES = ("auto", "1", "0")  # EAGLE_GEMV


class GemvLinear(nn.Linear):
    """An `nn.Linear` without bias whose forward is the GEMV op."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., in] -> [..., out]
        return torch.ops.eagle.gemv_linear(x, self.weight, MAX_ROWS)


def policy() -> str:
    """EAGLE_GEMV, checked."""
    value = os.environ.get("EAGLE_GEMV", "auto")
    if value not in CHOICES:
        raise ValueError(f"EAGLE_GEMV={value!r}: expected one of {', '.join(CHOICES)}")
    return value


def wanted() -> bool:
    """Whether this process routes bf16 linear layers through the kernel (`policy`, this CPU's instruction sets)."""
    flags = cpu_flags()
    choice = policy()
    if choice == "0" or "avx512_bf16" not in flags:
        return False
    return choice == "1" or "amx_bf16" not in flags


@cache
def kernel():
    """The kernel's extension (its op registered), or None where it cannot be built."""
    log.info("loading the GEMV kernel (%s; built at a machine's first use, ~15 s)", SOURCE.name)
    try:
        ext = native_extension("eagle_gemv_bf16", SOURCE)
    except Exception as error:  # no compiler, or a failed build: ATen's matmuls are exact, only slower here
        log.warning("GEMV kernel not built (%s); linear layers stay on ATen and inductor", str(error).splitlines()[0])
        return None
    torch.library.register_fake("eagle::gemv_linear")(_fake)
    return ext if ext.available() else None


def _fake(x: torch.Tensor, w: torch.Tensor, max_rows: int) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], w.shape[0])


def routable(layer: nn.Module) -> bool:
    """A bias-free `nn.Linear` with a contiguous bf16 weight on the CPU."""
    return (type(layer) is nn.Linear and layer.bias is None and layer.weight.dtype == torch.bfloat16
            and layer.weight.device.type == "cpu" and layer.weight.is_contiguous())


def route_linears(*modules: nn.Module) -> bool:
    """Route the routable layers of `modules` through the kernel when `wanted()` and it builds; whether any
    layer of theirs is routed now. Call before compiling their forwards."""
    layers = [m for module in modules for m in module.modules() if routable(m)]
    if layers and wanted() and kernel() is not None:
        for layer in layers:
            layer.__class__ = GemvLinear
        log.info("%d linear layers through the GEMV kernel (EAGLE_GEMV=0 turns it off)", len(layers))
    return routed(*modules)


def unroute_linears(*modules: nn.Module) -> None:
    """Back to `nn.Linear` (graphs compiled meanwhile keep the op)."""
    for module in modules:
        for layer in module.modules():
            if type(layer) is GemvLinear:
                layer.__class__ = nn.Linear


def routed(*modules: nn.Module) -> bool:
    """Whether any layer of `modules` runs through the kernel."""
    return any(type(m) is GemvLinear for module in modules for m in module.modules())
