"""Compiled graphs that hold equal weight copies keep one: `sharing()`.

Inductor's C++ GEMM template packs each frozen weight into its blocked layout and keeps the
packed copy as a constant of the compiled graph: in the graph object's `constants` and as a
global (such as `constant3`) of its generated Python module. Our decoder compiles a graph per
forward width and cache bucket over the same weights, and the packing does not depend on the
width: the target's linear layers come out as the same [n / 24, k, 24] fp32 tensors in every
graph on an AVX2 CPU. Unshared, each graph holds its own copy: ~1.3 GB a graph for the embedded
default in fp32 (docs/speed.md).

Inside `sharing()`, every graph inductor builds or loads from its cache has its large constants
replaced by an equal tensor (same dtype, shape and bytes, both contiguous) that an earlier graph
holds, and on exit the generated modules' globals are pointed at the same tensors, so the copies
are freed. Constants are read, never written, by the generated code: equal tensors are
interchangeable there, except a tensor that is part of a larger storage (a graph may read past its end), which
keeps its own. Tensors are remembered weakly, so a freed graph's constants are not kept.
On exit the memory the compile freed is also handed back to the system (`malloc_trim`).

    with sharing():
        compiled(x)      # compiles (or loads) a graph; its packed weights are the earlier graphs'
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import weakref

import torch

MIN_BYTES = 1 << 20  # smaller constants (norm weights, biases) are not worth comparing
GENERATED = "torch._inductor.runtime.compile_tasks."  # where inductor registers its output modules
SAMPLE = 4096  # elements of a tensor read for its key (strided); equality is checked in full

_KEPT: weakref.WeakValueDictionary[tuple, torch.Tensor] = weakref.WeakValueDictionary()
_active = 0  # open `sharing()` blocks
_libc = None  # glibc, once looked up (False: not there)


@contextlib.contextmanager
def sharing():
    """Graphs compiled or loaded inside share their large constants with earlier ones."""
    global _active
    hooked = install()
    _active += 1
    try:
        yield
    finally:
        _active -= 1
    if hooked:
        for name, module in list(sys.modules.items()):
            if name.startswith(GENERATED):
                _share_values(vars(module), module.__dict__.__setitem__)
    _return_freed_memory()


def install() -> bool:
    """Wrap inductor's compiled graph so that its constants are shared, when built and when loaded from
    the cache (idempotent). False when this torch has no such class: nothing is shared."""
    try:
        from torch._inductor.output_code import CompiledFxGraph
    except ImportError:
        return False
    for method in ("__init__", "after_deserialization"):
        current = getattr(CompiledFxGraph, method, None)
        if current is None:
            return False
        if not hasattr(current, "eagle_wraps"):
            setattr(CompiledFxGraph, method, _sharing_after(current))
    return True


def _sharing_after(method):
    def wrapped(graph, *args, **kwargs):
        out = method(graph, *args, **kwargs)
        constants = getattr(graph, "constants", None)
        if _active and isinstance(constants, dict):
            _share_values(constants, constants.__setitem__)
        return out

    wrapped.eagle_wraps = method
    return wrapped


def _share_values(values: dict, assign) -> None:
    for name, value in list(values.items()):
        if type(value) is torch.Tensor and value.nbytes >= MIN_BYTES and value.is_contiguous() and _whole(value):
            kept = _shared(value)
            if kept is not value:
                assign(name, kept)


def _whole(t: torch.Tensor) -> bool:
    """Whether `t` spans its whole storage. A part of a larger one (a weight joined with its siblings,
    eagle/compiled/sibling_weights.py) may be read past its end by a graph, so it is never swapped for a copy."""
    return t.storage_offset() == 0 and t.nbytes == t.untyped_storage().nbytes()


def _shared(t: torch.Tensor) -> torch.Tensor:
    """An equal tensor kept before, or `t`, now kept."""
    key = _key(t)
    kept = _KEPT.get(key)
    if kept is not None and (kept is t or torch.equal(kept, t)):
        return kept
    if kept is None:
        _KEPT[key] = t
    return t


def _return_freed_memory() -> None:
    """Give the memory a compile freed back to the system (glibc keeps it in its heaps otherwise: 0.8 GB
    after four target graphs of the embedded default). A no-op without glibc."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL("libc.so.6")
            _libc.malloc_trim  # noqa: B018 (glibc only)
        except (OSError, AttributeError):
            _libc = False
    if _libc:
        _libc.malloc_trim(0)


def _key(t: torch.Tensor) -> tuple:
    flat = t.detach().view(-1)  # contiguous
    sample = flat[:: max(1, flat.numel() // SAMPLE)].cpu().contiguous()
    return t.dtype, tuple(t.shape), t.device, hash(sample.view(torch.uint8).numpy().tobytes())
