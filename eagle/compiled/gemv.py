"""Our compiled graphs' bf16 linear layers through our GEMV kernel (`EAGLE_GEMV`), where a decode step is bound by
reading the weights.

    if gemv.active():                          # this CPU wants it (`wanted`) and the kernel is built
        count = gemv.rewrite_linears(graph)    # inductor's post-grad graph: bf16 x @ w^T -> eagle::gemv_linear

A decode step multiplies a few rows (1 for a plain step, a tree's nodes for a verify) by every weight once,
so it runs at the speed the weights are read. On a Zen 4 CPU (AVX512-BF16, no AMX) inductor's C++ GEMM
template and ATen's linear read them at 15-19 GB/s of the ~40 the memory streams; our kernel
(eagle/compiled/csrc/gemv_bf16.cpp: four output rows at a time, the input rows four at a time against the
same weights from L1) at ~30 (docs/speed.md). On a CPU with AMX a kernel of this kind lost to oneDNN inside
the compiled forward (docs/findings.md). Hence:

- `EAGLE_GEMV=auto` (the default): on where the CPU has AVX512-BF16 and no AMX;
- `EAGLE_GEMV=1`: on wherever the kernel builds (a CPU with AVX512-BF16); `EAGLE_GEMV=0`: off.

Only our compiled graphs change (eagle/compiled/graph_cache.py runs `rewrite_linears` as their post-grad pass):
the model's modules and every eager forward of them (HF `generate`, the eager runners, a prompt's prefill) keep
ATen's matmuls. The reply engine (data_prep/batched_decoding.py) does not take it: its steps are mostly
hundreds of rows, and a run of 256 conversations was no faster with it (docs/speed.md). The pass takes each
matmul of a bf16 2-D input by the transpose of a bf16 weight [O, I] (what `nn.Linear` without bias becomes); fp32 graphs
keep ATen's and the template's matmuls and their exact greedy equality with eager decoding. Rows past
MAX_ROWS take ATen's linear inside the op. A row's output does not depend on the rows beside it, so a
verify's rows equal a plain step's bit for bit. The kernel is built at a machine's first use (~20 s,
eagle/common/native_build.py).
"""

from __future__ import annotations

import logging
import threading
from functools import cache
from pathlib import Path

import torch

from eagle.common.env_choice import env_choice
from eagle.common.native_build import cpu_flags, native_extension

log = logging.getLogger("eagle")
SOURCE = Path(__file__).resolve().parent / "csrc" / "gemv_bf16.cpp"
MAX_ROWS = 32  # rows up to which the kernel runs (it and ATen tie at 32 on a Zen 4 CPU); more take ATen's linear
CHOICES = ("auto", "1", "0")  # EAGLE_GEMV
aten = torch.ops.aten
_BUILDING = threading.Lock()


def policy() -> str:
    """EAGLE_GEMV, checked."""
    return env_choice("EAGLE_GEMV", "auto", CHOICES)


def wanted() -> bool:
    """Whether this process's compiled graphs should take the kernel (`policy`, this CPU's instruction sets)."""
    flags = cpu_flags()
    choice = policy()
    if choice == "0" or "avx512_bf16" not in flags:
        return False
    return choice == "1" or "amx_bf16" not in flags


def active() -> bool:
    """Wanted here, and the kernel is built (building it at the first call)."""
    return wanted() and kernel() is not None


def kernel():
    """The kernel's extension (its op `eagle::gemv_linear` registered), or None where it cannot be built. The
    background preparation and the model's thread may both ask first: one builds, the other waits."""
    with _BUILDING:
        return _build()


@cache
def _build():
    log.info("loading the GEMV kernel (%s; built at a machine's first use, ~20 s)", SOURCE.name)
    try:
        ext = native_extension("eagle_gemv_bf16", SOURCE)
    except Exception as error:  # no compiler, or a failed build: ATen's matmuls are exact, only slower here
        log.warning("GEMV kernel not built (%s); matmuls stay on ATen and inductor", str(error).splitlines()[0])
        return None
    torch.library.register_fake("eagle::gemv_linear")(_fake)
    return ext if ext.available() else None


def _fake(x: torch.Tensor, w: torch.Tensor, max_rows: int) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], w.shape[0])


def rewrite_linears(graph: torch.fx.Graph) -> int:
    """Replace every `mm(x, w^T)` of bf16 x [M, I] by the transpose of a contiguous bf16 weight w [O, I] (a graph
    input, or a frozen constant, whose transpose freezing folds into a view of it) by
    `eagle::gemv_linear(x, w, MAX_ROWS)`, in place; how many were replaced."""
    count = 0
    for node in list(graph.nodes):
        weight = _weight(node)
        if weight is None:
            continue
        with graph.inserting_before(node):
            if weight is node.args[1]:  # w^T itself: its transpose is w, a view
                weight = graph.call_function(aten.permute.default, (weight, [1, 0]))
                weight.meta["val"] = _val(node.args[1]).t()
            op = graph.call_function(torch.ops.eagle.gemv_linear.default, (node.args[0], weight, MAX_ROWS))
        op.meta.update(node.meta)
        node.replace_all_uses_with(op)
        graph.erase_node(node)
        count += 1
    graph.eliminate_dead_code()
    return count


def _weight(node: torch.fx.Node) -> torch.fx.Node | None:
    """For `node` = mm(x, w^T) in bf16 with w [O, I] contiguous: the node of w (`permute(w, [1, 0])`'s input),
    or of w^T where it is a tensor of its own (a frozen constant's view); otherwise None."""
    if node.op != "call_function" or node.target != aten.mm.default:
        return None
    x, wt = node.args
    x_val, wt_val = _val(x), _val(wt)
    if x_val is None or wt_val is None or x_val.dtype != torch.bfloat16 or wt_val.dtype != torch.bfloat16:
        return None
    if wt.op == "call_function" and wt.target == aten.permute.default and list(wt.args[1]) == [1, 0]:
        w = _val(wt.args[0])
        return wt.args[0] if w is not None and w.is_contiguous() and w.device.type == "cpu" else None
    if wt.op in ("get_attr", "placeholder") and wt_val.t().is_contiguous() and wt_val.device.type == "cpu":
        return wt
    return None


def _val(node) -> torch.Tensor | None:
    """The node's (fake) tensor; a frozen constant's own tensor where the pass left no value in its meta."""
    if not isinstance(node, torch.fx.Node):
        return None
    val = node.meta.get("val")
    if val is None and node.op == "get_attr":
        val = getattr(node.graph.owning_module, node.target, None)
    return val if isinstance(val, torch.Tensor) else None


def key() -> str:
    """What a graph rewritten by the pass depends on beyond its own code: the rows the op takes."""
    return f"gemv-{MAX_ROWS}"
