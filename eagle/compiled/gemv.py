"""Our compiled graphs' linear layers through our GEMV kernel (`EAGLE_GEMV`), where a decode step is bound by
reading the weights.

    if gemv.active():                          # this CPU wants it (`kind`) and the kernel is built
        count = gemv.rewrite_linears(graph)    # inductor's post-grad graph: x @ w^T -> eagle::gemv_linear

A decode step multiplies a few rows (1 for a plain step, a tree's nodes for a verify) by every weight once,
so it runs at the speed the weights are read. The kernel (eagle/compiled/csrc/gemv_bf16.cpp: three or four output
rows at a time, up to eight input rows against them as the weights stream in) reads bf16 weights, in two kinds:

- `bf16`: bf16 rows. On a Zen 4 CPU (AVX512-BF16, no AMX) inductor's C++ GEMM template and ATen's linear read
  the weights at 15-19 GB/s of the ~40 the memory streams, the kernel at ~30 (docs/speed.md). On a CPU with AMX a
  kernel of this kind lost to oneDNN inside the compiled forward (docs/findings.md).
- `f32`: fp32 rows, where the CPU has AVX512F but no bf16 arithmetic and decoding therefore runs in fp32
  (eagle/common/precision.py). A weight whose every value is a bf16 value (a bf16 checkpoint loaded in fp32, as
  most are) is read through a bf16 copy, each value widened to fp32 in a register: the same products as the fp32
  model's, from half the bytes. On a 2-core AVX512F Xeon (12.6 GB/s) the compiled fp32 forward of 1 / 4 / 16
  rows took 37.6 / 47.0 / 117.2 ms against the template's 52.2 / 72.3 / 139.9 (docs/speed.md).

`EAGLE_GEMV=auto` (the default) takes the kind the CPU has: `bf16` with AVX512-BF16 and no AMX, `f32` with
AVX512F/BW/VL and no AVX512-BF16; `EAGLE_GEMV=1`: `bf16` wherever the CPU has AVX512-BF16 (AMX included);
`EAGLE_GEMV=0`: off.

Only our compiled graphs change (eagle/compiled/graph_cache.py runs `rewrite_linears` as their post-grad pass):
the model's modules and every eager forward of them (HF `generate`, the eager runners, a prompt's prefill) keep
ATen's matmuls. The reply engine (data_prep/batched_decoding.py) does not take it: its steps are mostly
hundreds of rows, and a run of 256 conversations was no faster with it (docs/speed.md). The pass takes each
matmul of a 2-D input by the transpose of a weight [O, I] (what `nn.Linear` without bias becomes): bf16 ones in
the `bf16` kind; in the `f32` kind fp32 ones over frozen weights of bf16 values (other fp32 weights keep ATen's
and the template's matmuls). Rows past MAX_ROWS take ATen's linear inside the op. A row's output does not depend
on the rows beside it, so a verify's rows equal a plain step's bit for bit; fp32 sums run in another order than
ATen's, so an fp32 greedy decoding may part from eager decoding only at a near-tie. The kernel is built at a
machine's first use (~20 s, eagle/common/native_build.py).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from functools import cache
from pathlib import Path

import torch

from eagle.common.env_choice import env_choice
from eagle.common.native_build import cpu_flags, optional_extension

log = logging.getLogger("eagle")
SOURCE = Path(__file__).resolve().parent / "csrc" / "gemv_bf16.cpp"
MAX_ROWS = {"bf16": 32, "f32": 16}  # rows up to which each kind runs (bf16: it and ATen tie at 32 on a Zen 4 CPU;
# f32: 2.3x ATen's fp32 linear at 16 rows on an AVX512F Xeon, 1.3x at 32); more take ATen's linear
F32_FLAGS = {"avx512f", "avx512bw", "avx512vl"}  # what the fp32 kind's widening loads need
CHOICES = ("auto", "1", "0")  # EAGLE_GEMV
aten = torch.ops.aten
_BUILDING = threading.Lock()


def policy() -> str:
    """EAGLE_GEMV, checked."""
    return env_choice("EAGLE_GEMV", "auto", CHOICES)


def kind() -> str | None:
    """Which linear layers this process's compiled graphs give the kernel (`policy`, this CPU's instruction sets):
    "bf16" (bf16 rows and weights: AVX512-BF16 without AMX, or EAGLE_GEMV=1), "f32" (fp32 rows over weights that
    are bf16 values, read as bf16: AVX512F without bf16 arithmetic, where decoding runs in fp32), or None."""
    flags = cpu_flags()
    choice = policy()
    if choice == "0":
        return None
    if "avx512_bf16" in flags:
        return "bf16" if choice == "1" or "amx_bf16" not in flags else None
    return "f32" if F32_FLAGS <= flags else None


def wanted() -> bool:
    """Whether this process's compiled graphs should take the kernel."""
    return kind() is not None


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
    ext = optional_extension("eagle_gemv_bf16", SOURCE, log, "matmuls stay on ATen and inductor")
    if ext is None:
        return None
    torch.library.register_fake("eagle::gemv_linear")(_fake)
    return ext if ext.available() or ext.available_f32() else None


def _fake(x: torch.Tensor, w: torch.Tensor, max_rows: int, full: torch.Tensor | None = None) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], w.shape[0])


def rewrite_linears(graph: torch.fx.Graph) -> int:
    """Replace every `mm(x, w^T)` of a 2-D x [M, I] by the transpose of a contiguous weight w [O, I] (a graph
    input, or a frozen constant, whose transpose freezing folds into a view of it) by
    `eagle::gemv_linear(x, w16, MAX_ROWS)`, in place: of the `kind()` "bf16", bf16 x and w (w16 = w); of "f32",
    fp32 x and a frozen fp32 w whose every value is a bf16 value (w16: its bf16 copy, a new constant of the
    graph; the products are the same, the bytes read half), with the mm's own w^T for rows past MAX_ROWS. How
    many were replaced."""
    which = kind()
    count = 0
    for node in list(graph.nodes):
        weight = _weight(node, torch.bfloat16 if which == "bf16" else torch.float32)
        if weight is not None and which == "f32":
            weight = _bf16_constant(graph, node, weight)
        if weight is None:
            continue
        with graph.inserting_before(node):
            if weight is node.args[1]:  # w^T itself: its transpose is w, a view
                weight = graph.call_function(aten.permute.default, (weight, [1, 0]))
                weight.meta["val"] = _val(node.args[1]).t()
            full = (node.args[1],) if which == "f32" else ()  # rows past MAX_ROWS: the graph's own fp32 w^T
            args = (node.args[0], weight, MAX_ROWS[which], *full)
            op = graph.call_function(torch.ops.eagle.gemv_linear.default, args)
        op.meta.update(node.meta)
        node.replace_all_uses_with(op)
        graph.erase_node(node)
        count += 1
    graph.eliminate_dead_code()
    return count


def _weight(node: torch.fx.Node, dtype: torch.dtype) -> torch.fx.Node | None:
    """For `node` = mm(x, w^T) in `dtype` with w [O, I] contiguous: the node of w (`permute(w, [1, 0])`'s input),
    or of w^T where it is a tensor of its own (a frozen constant's view); otherwise None."""
    if node.op != "call_function" or node.target != aten.mm.default:
        return None
    x, wt = node.args
    x_val, wt_val = _val(x), _val(wt)
    if x_val is None or wt_val is None or x_val.dtype != dtype or wt_val.dtype != dtype:
        return None
    if wt.op == "call_function" and wt.target == aten.permute.default and list(wt.args[1]) == [1, 0]:
        w = _val(wt.args[0])
        return wt.args[0] if w is not None and w.is_contiguous() and w.device.type == "cpu" else None
    if wt.op in ("get_attr", "placeholder") and wt_val.t().is_contiguous() and wt_val.device.type == "cpu":
        return wt
    return None


def _bf16_constant(graph: torch.fx.Graph, node: torch.fx.Node, weight: torch.fx.Node) -> torch.fx.Node | None:
    """A new frozen constant holding the bf16 copy of `weight` (a frozen fp32 w [O, I], or w^T's view), contiguous
    [O, I], where every value of w is a bf16 value; None where one is not (or w is not a constant)."""
    module = graph.owning_module
    if weight.op != "get_attr" or module is None:
        return None
    w = getattr(module, weight.target)
    w = w if weight is not node.args[1] else w.t()  # [O, I]
    w16 = w.to(torch.bfloat16).contiguous()
    if not torch.equal(w16.float(), w):
        return None
    name = f"{weight.target}_bf16"
    module.register_buffer(name, w16, persistent=False)
    with graph.inserting_before(node):
        copy = graph.get_attr(name)
    fake = _val(node.args[0])
    copy.meta["val"] = fake.fake_mode.from_tensor(w16, static_shapes=True) if getattr(fake, "fake_mode", None) else w16
    return copy


def _val(node) -> torch.Tensor | None:
    """The node's (fake) tensor; a frozen constant's own tensor where the pass left no value in its meta."""
    if not isinstance(node, torch.fx.Node):
        return None
    val = node.meta.get("val")
    if val is None and node.op == "get_attr":
        val = getattr(node.graph.owning_module, node.target, None)
    return val if isinstance(val, torch.Tensor) else None


def key() -> str:
    """What a graph rewritten by the pass depends on beyond its own code: the kind, the rows the op takes, and
    this pass's and the kernel's sources (a changed pass must not be served its old graphs from inductor's cache)."""
    which = kind()
    return f"gemv-{which}-{MAX_ROWS.get(which)}-{_sources_digest()}"


@cache
def _sources_digest() -> str:
    return hashlib.sha256(Path(__file__).read_bytes() + SOURCE.read_bytes()).hexdigest()[:12]
