"""Compiled graphs a second process loads from disk instead of compiling again.

Inductor keeps compiled graphs in its FX graph cache (under `TORCHINDUCTOR_CACHE_DIR`, by default
the system's temporary folder), keyed by the graph, the torch build, the CPU and the thread count.
Two things kept our frozen graphs out of it, and one made reusing them unsafe:

- **oneDNN-packed weights.** With `freezing`, inductor on a CPU rewrites each linear layer into
  oneDNN's packed form (`cpp.weight_prepack`); packed weights are mkldnn tensors, which the cache
  cannot pickle, so it skipped every graph and each process lowered, generated and loaded them
  all again. Our graphs compile with `cpp.weight_prepack` off (`compile_options`).
- **The C++ GEMM template without prepacking.** The template, which autotuning picks for our
  forwards (at 8-16 rows 1.6x faster than oneDNN's prepacked matmuls, as fast at 1-4 rows:
  docs/speed.md), packs the weights itself into ordinary tensors, but inductor offers it only
  while `cpp.weight_prepack` is on. `install_template_gemm` lets the matmul lowerings offer it
  with prepacking off.
- **Weights inside the cached graph.** The cache keys frozen weights by shape and dtype only and
  stores the template's packed copies of them with the graph: a second model of the same shapes
  (another head, a fine-tuned target) would run with the first one's weights. `weights_key`
  adds a digest of the module's weights to the key of every graph compiled for it.

    with compiled_call(compiling, target):                 # head graphs: (head, scorer)
        out = compiled(...)                                  # a cache hit in a second process

A second process still traces each forward (dynamo, AOT autograd, freezing: about 20 s a graph
for the embedded default's target, where compiling it took 90-130 s); lowering, generating and
compiling C++ and autotuning are what it skips.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import weakref

import torch
import torch._inductor.config as inductor
from torch import nn
from torch._inductor.custom_graph_pass import CustomGraphPass

SAMPLE = 65536  # elements of each tensor the digest reads (strided over the whole tensor)
_DIGESTS: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()


def compiled_call(compiling: bool, *modules: nn.Module) -> contextlib.AbstractContextManager:
    """The context of one call of a graph over `modules`' weights.

    While a shape compiles (`compiling`: the caller has not run it before): `compile_options` and
    all of dynamo's guards. Later calls skip both: entering the options cost 40 µs a call (six
    calls a decode step), and the full guard checks 1-1.7 ms a target forward (272 parameters)
    while nothing they check changes between the calls of a compiled shape (same module, dtype,
    cache tensors, inference mode). Dynamo then checks only the guards that tell this code
    object's graphs apart (`skip_guard_eval_unsafe`), and refuses to compile a call (a RuntimeError,
    not a graph silently compiled without our options)."""
    if compiling:
        return inductor.patch(**compile_options(*modules))
    return torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)


def compile_options(*modules: nn.Module) -> dict:
    """Inductor settings of a graph over `modules`' weights. `freezing`: the weights become graph
    constants; `max_autotune`: each matmul times inductor's C++ GEMM template against ATen's and
    keeps the faster (the template, at every width our forwards use, on this CPU: docs/speed.md).
    Without the template hook (`install_template_gemm`) graphs keep oneDNN prepacking, uncached.
    EAGLE_AUTOTUNE=0 skips the timing (ATen's matmuls): the test suite's tiny models compile in a
    fraction of the time, since autotuning builds and times a C++ kernel per candidate."""
    options = {"freezing": True, **weights_key(*modules)}
    if os.environ.get("EAGLE_AUTOTUNE", "1") != "0":
        options.update(max_autotune=True, max_autotune_gemm_backends="CPP,ATEN")
    if install_template_gemm():
        options["cpp.weight_prepack"] = False
    return options


def install_template_gemm() -> bool:
    """Let inductor's mm/addmm lowering offer the C++ GEMM template while `cpp.weight_prepack` is off
    (idempotent). False when this torch has no such hook: graphs then keep oneDNN prepacking."""
    try:
        from torch._inductor.kernel import mm as lowering
    except ImportError:
        return False
    current = getattr(lowering, "use_cpp_gemm_template", None)
    if current is None:
        return False
    if not hasattr(current, "eagle_wraps"):
        def offered(*args, **kwargs):
            with inductor.patch({"cpp.weight_prepack": True}):  # the template's own gate, nothing else
                return current(*args, **kwargs)

        offered.eagle_wraps = current
        lowering.use_cpp_gemm_template = offered
    return True


class _WeightsKey(CustomGraphPass):
    """A graph pass that changes nothing: its uuid (the weights' digest) joins the FX graph cache key."""

    def __init__(self, digest: str):
        self.digest = digest

    def __call__(self, graph: torch.fx.Graph) -> None:
        return None

    def uuid(self) -> str:
        return self.digest


def weights_key(*modules: nn.Module) -> dict:
    """Inductor options that key the graphs compiled for `modules` by their weights (`weights_digest`)."""
    return {"post_grad_custom_post_pass": _WeightsKey("-".join(weights_digest(m) for m in modules))}


def weights_digest(module: nn.Module) -> str:
    """Digest of a module's parameters and buffers: names, shapes, dtypes and a strided sample of up
    to SAMPLE elements of each (any retraining or fine-tuning changes the samples). Computed once
    per module object; weights changed in place afterwards are not seen."""
    if module not in _DIGESTS:
        h = hashlib.sha256()
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            flat = t.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // SAMPLE)].cpu().contiguous()
            h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
            h.update(sample.view(torch.uint8).numpy().tobytes() if sample.numel() else b"")
        _DIGESTS[module] = h.hexdigest()
    return _DIGESTS[module]
