"""Our compiled graphs' linear layers through our GEMV kernel (`EAGLE_GEMV`), where a decode step is bound by
reading the weights.

    if gemv.active():                          # this CPU wants it (`kind`) and the kernel is built
        count = gemv.rewrite_linears(graph)    # inductor's post-grad graph: x @ w^T -> eagle::gemv_linear

A decode step multiplies a few rows (1 for a plain step, a tree's nodes for a verify) by every weight once,
so it runs at the speed the weights are read. The kernel (eagle/compiled/csrc/gemv_bf16.cpp: a few output rows at
a time, up to eight input rows against them as the weights stream in) reads bf16 weights, in two kinds:

- `bf16`: bf16 rows. On a Zen 4 CPU (AVX512-BF16, no AMX) inductor's C++ GEMM template and ATen's linear read
  the weights at 15-19 GB/s of the ~40 the memory streams, the kernel at ~30 (docs/speed.md). On a CPU with AMX a
  kernel of this kind lost to oneDNN inside the compiled forward (docs/findings.md).
- `f32`: fp32 rows, where the CPU has AVX512F (16 lanes a register), or AVX2 and FMA (8), but no bf16 arithmetic and
  decoding therefore runs in fp32 (eagle/common/precision.py). A weight whose every value is a bf16 value (a bf16
  checkpoint loaded in fp32, as most are) is read through a bf16 copy (the 8-lane form's packed in pairs of output
  rows: `pack`), each value widened to fp32 in a register: the same products as the fp32 model's, from half the
  bytes. On a 2-core AVX512F Xeon (12.6 GB/s) the compiled fp32 forward of 1 / 4 / 16 rows took 37.6 / 47.0 / 117.2
  ms against the template's 52.2 / 72.3 / 139.9; on a 2-core Zen 3 (AVX2) 1 / 4 / 8 rows 13.1 / 16.2 / 25.1 ms
  against 21.9 / 28.0 / 38.1 (docs/speed.md).
- `int8` drafts: the draft head's graphs (and only theirs) read each weight as int8 codes with one fp32 scale a row,
  multiplied by the input rows rounded to 16-bit integers (`int8_pack`, `eagle::gemv_int8_linear`: exact integer
  sums, 16 products an instruction), where the kernel runs its AVX2 form in the `f32` kind
  (`int8_drafts`, EAGLE_DRAFT_INT8). The draft only proposes tokens and the target's verify, whose weights stay
  exact, decides which are output: the output is unchanged, τ may move (docs/speed.md).
- the screened lm_head: in the same places, the target's lm_head (`eagle::gemv_screened_linear`, `screen_pack`)
  reads int8 codes first in a greedy step of up to SCREEN_ROWS rows (`screened_argmax`, EAGLE_GREEDY_SCREEN), where
  only each row's argmax is used: bounds on the codes' error rule out all but a handful of tokens, which get their
  exact logits (the bits of the unscreened call), the rest -inf. The argmax and its ties are exact.

`EAGLE_GEMV=auto` (the default) takes the kind the CPU has: `bf16` with AVX512-BF16 and no AMX, `f32` with
AVX512F/BW/VL, or AVX2/FMA, and no AVX512-BF16; `EAGLE_GEMV=1`: `bf16` wherever the CPU has AVX512-BF16 (AMX included);
`EAGLE_GEMV=0`: off.

Only our compiled graphs change (eagle/compiled/graph_cache.py runs `rewrite_linears` as their post-grad pass):
the model's modules and every eager forward of them (HF `generate`, the eager runners, a prompt's prefill) keep
ATen's matmuls. The reply engine (data_prep/batched_decoding.py) does not take it: its steps are mostly
hundreds of rows, and a run of 256 conversations was no faster with it (docs/speed.md). The pass takes each
matmul of a 2-D input by the transpose of a weight [O, I] (what `nn.Linear` without bias becomes): bf16 ones in
the `bf16` kind; in the `f32` kind fp32 ones over frozen weights of bf16 values (other fp32 weights keep ATen's
and the template's matmuls). Sibling weights joined in one storage (each layer's q/k/v and gate/up:
eagle/compiled/sibling_weights.py, done by the compiled target and head) take one call over their span, 4 calls
a layer instead of 7. Rows past MAX_ROWS take ATen's linear inside the op. A row's output does not depend
on the rows beside it, so a verify's rows equal a plain step's bit for bit; fp32 sums run in another order than
ATen's, so an fp32 greedy decoding may part from eager decoding only at a near-tie. The kernel is built at a
machine's first use (~20 s, eagle/common/native_build.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
from functools import cache
from pathlib import Path

import torch

from eagle.common.env_choice import env_choice
from eagle.common.native_build import cpu_flags, optional_extension
from eagle.compiled.int8_codes import int8_pack, screen_pack
from eagle.compiled.sibling_weights import sibling_runs

log = logging.getLogger("eagle")
SOURCE = Path(__file__).resolve().parent / "csrc" / "gemv_bf16.cpp"
MAX_ROWS = {"bf16": 32, "f32": 16}  # rows up to which each kind runs (bf16: it and ATen tie at 32 on a Zen 4 CPU;
# f32: 2.3x ATen's fp32 linear at 16 rows on an AVX512F Xeon, 1.3x at 32); more take ATen's linear
F32_FLAGS = {"avx512f", "avx512bw", "avx512vl"}  # the fp32 kind's 16-lane form: masked widening loads
AVX2_FLAGS = {"avx2", "fma"}  # its 8-lane form, on CPUs without AVX512
PACKED = (2, 2, 4)  # the 8-lane form's weights: for each 8 inputs, 2 halves x 2 output rows x 4 inputs (`pack`)
SCREEN_ROWS = 4  # rows up to which a greedy step's lm_head screens (docs/speed.md: at 6 it was slower)
CHOICES = ("auto", "1", "0")  # EAGLE_GEMV
aten = torch.ops.aten
_BUILDING = threading.Lock()


def policy() -> str:
    """EAGLE_GEMV, checked."""
    return env_choice("EAGLE_GEMV", "auto", CHOICES)


def kind() -> str | None:
    """Which linear layers this process's compiled graphs give the kernel (`policy`, this CPU's instruction sets):
    "bf16" (bf16 rows and weights: AVX512-BF16 without AMX, or EAGLE_GEMV=1), "f32" (fp32 rows over weights that
    are bf16 values, read as bf16: AVX512F, or AVX2 with FMA, without bf16 arithmetic, where decoding runs in fp32),
    or None."""
    flags = cpu_flags()
    choice = policy()
    if choice == "0":
        return None
    if "avx512_bf16" in flags:
        return "bf16" if choice == "1" or "amx_bf16" not in flags else None
    return "f32" if f32_capable(flags) else None


def f32_capable(flags: set[str]) -> bool:
    """Whether a CPU of these instruction-set flags runs the fp32 kind (16 or 8 lanes a register)."""
    return F32_FLAGS <= flags or AVX2_FLAGS <= flags


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
    torch.library.register_fake("eagle::gemv_int8_linear")(_fake_int8)
    torch.library.register_fake("eagle::gemv_screened_linear")(_fake_screened)
    return ext if ext.available() or ext.available_f32() else None


def _fake(x: torch.Tensor, w: torch.Tensor, max_rows: int, full: torch.Tensor | None = None) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], out_features(w))


def _fake_int8(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, max_rows: int, full: torch.Tensor) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], scale.shape[0])


def _fake_screened(x: torch.Tensor, w: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, slack: torch.Tensor,
                   max_rows: int, screen_rows: int, full: torch.Tensor) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], scale.shape[0])


def out_features(w: torch.Tensor) -> int:
    """O of a weight the op reads: [O, I], or packed [O/2, I/8, 2, 2, 4] (`pack`)."""
    return w.shape[0] * w.shape[3] if w.dim() == 5 else w.shape[0]


def in_features(w: torch.Tensor) -> int:
    """I of a weight the op reads: [O, I], or packed [O/2, I/8, 2, 2, 4] (`pack`)."""
    return w.shape[1] * w.shape[2] * w.shape[4] if w.dim() == 5 else w.shape[1]


def pack(w: torch.Tensor) -> torch.Tensor | None:
    """w [O, I] in the layout this build's kernel reads: itself, or where it reads pairs of output rows (its AVX2
    form) [O/2, I/8, 2, 2, 4]: pair p holds, for each 8 inputs in turn, their first 4 weights of rows 2p and
    2p + 1, then their last 4 of both, so a pair streams as one run of bytes and a 32-byte chunk widens into the
    two rows' registers in one instruction each (None where O is odd or I not a multiple of 8)."""
    if not kernel().packed():
        return w
    (o, i), (halves, rows, inputs) = w.shape, PACKED
    if o % rows or i % (halves * inputs):
        return None
    return w.reshape(o // rows, rows, i // (halves * inputs), halves, inputs).permute(0, 2, 3, 1, 4).contiguous()


def int8_drafts() -> bool:
    """Whether the draft head's compiled graphs read their weights as int8 (`int8_pack`; EAGLE_DRAFT_INT8, "auto" by
    default: where the kernel's AVX2 form runs the fp32 kind, i.e. on CPUs without AVX512 and without bf16
    arithmetic; "0": never). The draft only proposes tokens: the target's verify decides what is output, so
    approximate draft weights change τ, never the output."""
    choice = env_choice("EAGLE_DRAFT_INT8", "auto", ("auto", "0"))
    return choice == "auto" and _avx2_f32()


def screens() -> bool:
    """Whether greedy steps' target graphs screen their lm_head (`screen_pack`; EAGLE_GREEDY_SCREEN, "auto" by
    default: where the kernel's AVX2 form runs the fp32 kind, as `int8_drafts`; "0": never)."""
    choice = env_choice("EAGLE_GREEDY_SCREEN", "auto", ("auto", "0"))
    return choice == "auto" and _avx2_f32()


def _avx2_f32() -> bool:
    """Whether the kernel runs its AVX2 form (CPUs without AVX512) in the fp32 kind (no bf16 arithmetic)."""
    return kind() == "f32" and active() and kernel().packed()


@contextlib.contextmanager
def screened_argmax(on: bool):
    """Within (where `on` and `screens()`): this thread's compiled target forwards are greedy steps, whose logits
    feed an argmax and nothing else, so an lm_head of `screen_pack`'s codes may screen: each row's logits exact
    for the tokens that may be or tie its largest, -inf for the others. Set around each such forward, never around
    a generator's whole run, which may yield to a sampling step in the same thread."""
    ext = kernel() if on and screens() else None
    if ext is None:
        yield
        return
    before = ext.set_screening(True)
    try:
        yield
    finally:
        ext.set_screening(before)


def reads(w: torch.Tensor) -> bool:
    """Whether this process's compiled graphs give a frozen weight w [O, I] on the CPU to the kernel (`active()`,
    `kind()`): bf16 in "bf16"; fp32 with bf16 values only in "f32"."""
    if w.device.type != "cpu" or w.dim() != 2 or not active():
        return False
    if kind() == "bf16":
        return w.dtype == torch.bfloat16
    return w.dtype == torch.float32 and _kernel_copy(w.detach()) is not None


def rewrite_linears(graph: torch.fx.Graph, int8: bool = False, screen: torch.Tensor | None = None) -> int:
    """Replace every `mm(x, w^T)` of a 2-D x [M, I] by the transpose of a contiguous weight w [O, I] (a graph
    input, or a frozen constant, whose transpose freezing folds into a view of it) by
    `eagle::gemv_linear(x, w16, MAX_ROWS)`, in place: of the `kind()` "bf16", bf16 x and w (w16 = w); of "f32",
    fp32 x and a frozen fp32 w whose every value is a bf16 value (w16: its bf16 copy, a new constant of the
    graph; the products are the same, the bytes read half), with the mm's own w^T for rows past MAX_ROWS.
    Frozen weights of one x whose rows follow one another in one storage (siblings joined by
    eagle/compiled/sibling_weights.py) take one call over the span of them, each mm then a slice of its
    columns. int8 (the draft head's graphs, `int8_drafts`): in the "f32" kind each such weight is read as int8
    codes and row scales instead (`eagle::gemv_int8_linear`, `int8_pack`), an approximation. `screen` (the
    target's lm_head weight [O, I], where `screens()`): in the "f32" kind its mm becomes
    `eagle::gemv_screened_linear`, which screens in greedy steps (`screened_argmax`). How many mms were
    replaced."""
    which = kind()
    dtype = torch.bfloat16 if which == "bf16" else torch.float32
    order = {node: i for i, node in enumerate(graph.nodes)}
    by_input: dict[torch.fx.Node, list[tuple[torch.fx.Node, torch.fx.Node]]] = {}
    for node in graph.nodes:
        weight = _weight(node, dtype)
        if weight is not None:
            by_input.setdefault(node.args[0], []).append((node, weight))
    count = 0
    for linears in by_input.values():
        for run in _runs(linears):
            count += _replace(graph, run, which, min((mm for mm, _, _ in run), key=order.__getitem__),
                              int8 and which == "f32", screen if which == "f32" else None)
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


def _runs(linears: list[tuple[torch.fx.Node, torch.fx.Node]]) -> list[list[tuple]]:
    """The (mm, weight node) pairs of one input in runs of (mm, weight node, w [O, I] or None): frozen weights
    whose rows follow one another in one storage share a run, in storage order; any other weight runs alone."""
    loose, frozen = [], []
    for mm, weight in linears:
        w = _frozen_matrix(mm, weight)
        (loose if w is None else frozen).append((mm, weight, w))
    frozen.sort(key=lambda t: (t[2].untyped_storage().data_ptr(), t[2].storage_offset()))
    runs = sibling_runs([w for _, _, w in frozen])
    return [[entry] for entry in loose] + [[frozen[i] for i in run] for run in runs]


def _frozen_matrix(mm: torch.fx.Node, weight: torch.fx.Node) -> torch.Tensor | None:
    """The real w [O, I] behind `weight` (w, or w^T = the mm's own argument) where it is a frozen constant."""
    module = mm.graph.owning_module
    if weight.op != "get_attr" or module is None:
        return None
    w = getattr(module, weight.target)
    return w if weight is not mm.args[1] else w.t()


def _replace(graph: torch.fx.Graph, run: list[tuple], which: str, before: torch.fx.Node, int8: bool = False,
             screen: torch.Tensor | None = None) -> int:
    """One call of our op for the run's mms (`_gemv_call`, inserted before `before`, the first of them in the
    graph), each mm's uses then taking its columns of the output; how many mms were replaced (0: fp32 weights whose
    values are not all bf16 values keep their mms, unless int8)."""
    with graph.inserting_before(before):
        op = _gemv_call(graph, run, which, int8, screen)
    if op is None:
        return 0
    mm, x = run[0][0], _val(run[0][0].args[0])
    op.meta.update(mm.meta)
    op.meta["val"] = x.new_empty(x.shape[0], sum(_val(node).shape[1] for node, _, _ in run))  # [M, O]: all outputs
    start = 0
    for node, _, part in run:
        use = op
        if len(run) > 1:  # its columns of the joined output
            with graph.inserting_before(node):
                use = graph.call_function(aten.slice.Tensor, (op, 1, start, start + part.shape[0]))
            use.meta.update(node.meta)
            use.meta["val"] = op.meta["val"][:, start:start + part.shape[0]]  # [M, O_i]
            start += part.shape[0]
        node.replace_all_uses_with(use)
        graph.erase_node(node)
    return len(run)


def _gemv_call(graph: torch.fx.Graph, run: list[tuple], which: str, int8: bool,
               screen: torch.Tensor | None = None) -> torch.fx.Node | None:
    """The node of `eagle::gemv_linear` over the run's weights (one, or a span of joined ones), with int8 of
    `eagle::gemv_int8_linear` (`_int8_call`), for the `screen` weight of `eagle::gemv_screened_linear`; None where
    the weights cannot be read so."""
    mm, weight, w = run[0]
    x = _val(mm.args[0])
    weight, w, full_t = _joined(graph, run, which) if len(run) > 1 else (weight, w, mm.args[1])
    if int8:
        return _int8_call(graph, w, x, mm.args[0], full_t)
    if which == "f32":
        weight = _bf16_constant(graph, w, x) if w is not None else None
        if weight is None:
            return None
        if screen is not None and len(run) == 1 and _same_tensor(w, screen):
            return _screened_call(graph, weight, w, x, mm.args[0], full_t)
    elif weight is mm.args[1]:  # w^T itself: its transpose is w, a view
        weight = graph.call_function(aten.permute.default, (weight, [1, 0]))
        weight.meta["val"] = _val(mm.args[1]).t()
    full = (full_t,) if which == "f32" else ()  # rows past MAX_ROWS: the graph's own fp32 w^T
    return graph.call_function(torch.ops.eagle.gemv_linear.default, (mm.args[0], weight, MAX_ROWS[which], *full))


def _joined(graph: torch.fx.Graph, run: list[tuple], which: str) -> tuple:
    """For a run of joined frozen weights: the node of their span [rows, I] (bf16 kind), that span's real tensor,
    and (f32 kind) the node of its transpose [I, rows], the mm's w^T for rows past MAX_ROWS. Views of the
    first weight's frozen constant reaching over the others: no new constant, the graph reads the model's own
    storage."""
    _, weight, first = run[0]
    rows, inputs = sum(w.shape[0] for _, _, w in run), first.shape[1]
    offset = first.storage_offset()
    constant = graph.get_attr(weight.target)
    constant.meta["val"] = _fake_like(getattr(graph.owning_module, weight.target), _val(run[0][0].args[0]))

    def view(size: list[int], stride: list[int]) -> torch.fx.Node:
        node = graph.call_function(aten.as_strided.default, (constant, size, stride, offset))
        node.meta["val"] = constant.meta["val"].as_strided(size, stride, offset)
        return node

    span = first.as_strided((rows, inputs), (inputs, 1), offset)  # [rows, I]
    if which == "f32":
        return None, span, view([inputs, rows], [1, inputs])
    return view([rows, inputs], [inputs, 1]), span, None


def _bf16_constant(graph: torch.fx.Graph, w: torch.Tensor, like: torch.Tensor) -> torch.fx.Node | None:
    """A new frozen constant holding the bf16 copy of w [O, I] (a frozen fp32 weight, or a span of joined ones) in
    the kernel's layout (`pack`), where every value of w is a bf16 value and the layout takes its shape (None
    otherwise); faked as `like` is."""
    w16 = _kernel_copy(w)
    return None if w16 is None else _constant(graph, "_eagle_bf16_", w16, like)


def _int8_call(graph: torch.fx.Graph, w: torch.Tensor | None, like: torch.Tensor, x: torch.fx.Node,
               full_t: torch.fx.Node) -> torch.fx.Node | None:
    """`eagle::gemv_int8_linear(x, codes, scales, MAX_ROWS, full_t)` over new frozen constants holding
    `int8_pack(w)` (w [O, I]: a frozen fp32 weight or a span of joined ones); None where w is not frozen or the
    packing does not take its shape."""
    packed = int8_pack(w) if w is not None else None
    if packed is None:
        return None
    nodes = [_constant(graph, "_eagle_int8_", t, like) for t in packed]
    return graph.call_function(torch.ops.eagle.gemv_int8_linear.default, (x, *nodes, MAX_ROWS["f32"], full_t))


def _screened_call(graph: torch.fx.Graph, weight: torch.fx.Node, w: torch.Tensor, like: torch.Tensor,
                   x: torch.fx.Node, full_t: torch.fx.Node) -> torch.fx.Node:
    """`eagle::gemv_screened_linear(x, w16, codes, scales, slack, MAX_ROWS, SCREEN_ROWS, full_t)` over w16 (the
    `weight` node of w's bf16 copy) and new frozen constants of `screen_pack(w)`; the plain GEMV where the packing
    does not take w's shape."""
    packed = screen_pack(w)
    if packed is None:
        return graph.call_function(torch.ops.eagle.gemv_linear.default, (x, weight, MAX_ROWS["f32"], full_t))
    nodes = [_constant(graph, "_eagle_screen_", t, like) for t in packed]
    return graph.call_function(torch.ops.eagle.gemv_screened_linear.default,
                               (x, weight, *nodes, MAX_ROWS["f32"], SCREEN_ROWS, full_t))


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b are the same elements of one storage (a frozen constant and the module's weight)."""
    return (a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.storage_offset() == b.storage_offset()
            and a.shape == b.shape and a.stride() == b.stride())


def _constant(graph: torch.fx.Graph, prefix: str, t: torch.Tensor, like: torch.Tensor) -> torch.fx.Node:
    """A new frozen constant of the graph's module holding t, named prefix + a count; faked as `like` is."""
    module = graph.owning_module
    name = f"{prefix}{sum(name.startswith(prefix) for name in module._buffers)}"
    module.register_buffer(name, t, persistent=False)
    node = graph.get_attr(name)
    node.meta["val"] = _fake_like(t, like)
    return node


def _kernel_copy(w: torch.Tensor) -> torch.Tensor | None:
    """w's values as bf16 in the kernel's layout (`pack`), where every one of them is a bf16 value and the
    layout takes w's shape; otherwise None."""
    w16 = w.to(torch.bfloat16).contiguous()
    return pack(w16) if torch.equal(w16.float(), w) else None


def _fake_like(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`t` as a fake tensor of `like`'s fake mode, or `t` where `like` is real."""
    mode = getattr(like, "fake_mode", None)
    return mode.from_tensor(t, static_shapes=True) if mode is not None else t


def _val(node) -> torch.Tensor | None:
    """The node's (fake) tensor; a frozen constant's own tensor where the pass left no value in its meta."""
    if not isinstance(node, torch.fx.Node):
        return None
    val = node.meta.get("val")
    if val is None and node.op == "get_attr":
        val = getattr(node.graph.owning_module, node.target, None)
    return val if isinstance(val, torch.Tensor) else None


def key(int8: bool = False, screen: bool = False) -> str:
    """What a graph rewritten by the pass depends on beyond its own code: the kind, the rows the op takes, whether
    it reads int8 weights or screens its lm_head, and this pass's and the kernel's sources (a changed pass must not
    be served its old graphs from inductor's cache)."""
    which = kind()
    screened = f"-screen{SCREEN_ROWS}" if screen else ""
    return f"gemv-{which}-{MAX_ROWS.get(which)}{'-int8' * int8}{screened}-{_sources_digest()}"


@cache
def _sources_digest() -> str:
    codes = Path(__file__).with_name("int8_codes.py")
    return hashlib.sha256(Path(__file__).read_bytes() + codes.read_bytes() + SOURCE.read_bytes()).hexdigest()[:12]
