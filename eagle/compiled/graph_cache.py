"""Compiled graphs a second process loads from disk instead of compiling again.

Inductor keeps compiled graphs in its FX graph cache (under `TORCHINDUCTOR_CACHE_DIR`, by default
the system's temporary folder), keyed by the graph, the torch build, the CPU and the thread count.
Two things kept our frozen graphs out of it, and one made reusing them unsafe:

- **oneDNN-packed weights.** With `freezing`, inductor on a CPU rewrites each linear layer into
  oneDNN's packed form (`cpp.weight_prepack`); packed weights are mkldnn tensors, which the cache
  cannot pickle, so it skipped every graph and each process lowered, generated and loaded them
  all again. Our graphs compile with `cpp.weight_prepack` off (`compile_options`).
- **The C++ GEMM template without prepacking.** The template, which our graphs take for their
  matmuls (1.5-2.5x faster than ATen's or oneDNN's at 1-16 rows: docs/speed.md), packs the
  weights itself into ordinary tensors, but inductor offers it only while `cpp.weight_prepack`
  is on. `install_template_gemm` lets the matmul lowerings offer it with prepacking off.
- **Weights inside the cached graph.** The cache keys frozen weights by shape and dtype only and
  stores the template's packed copies of them with the graph: a second model of the same shapes
  (another head, a fine-tuned target) would run with the first one's weights. `weights_key`
  adds a digest of the module's weights to the key of every graph compiled for it.

    with compiled_call(compiling, target):                 # head graphs: (head, scorer)
        out = compiled(...)                                  # a cache hit in a second process

A second process still traces each forward (dynamo, AOT autograd, freezing: about 20 s a graph
for the embedded default's target, where compiling it took 90-130 s); lowering, generating and
compiling C++ are what it skips.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import weakref

import torch
import torch._inductor.config as inductor
from torch import nn
from torch._inductor.custom_graph_pass import CustomGraphPass

from eagle.common.env_choice import env_choice
from eagle.common.forward_lock import one_forward
from eagle.compiled import attention_kernel, gemv
from eagle.compiled.shared_constants import sharing

log = logging.getLogger("eagle")
SAMPLE = 65536  # elements of each tensor the digest reads (strided over the whole tensor)
_DIGESTS: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()
_WARNED: set[tuple[int, int]] = set()  # (compiled at, called at) thread counts already reported


def compiled_call(compiling: bool, *modules: nn.Module, threads: int | None = None,
                  draft: bool = False) -> contextlib.AbstractContextManager:
    """The context of one call of a graph over `modules`' weights.

    While a shape compiles (`compiling`: the caller has not run it before): `compile_options`, all of
    dynamo's guards, and torch's thread count set to `threads` (the model's, whichever thread compiles:
    `threads_match`). Later calls (of a shape the runner cannot call directly: eagle/compiled/direct_call.py)
    skip the options and guards: entering the options cost 40 µs a call (six calls a decode step), and the
    full guard checks 1-1.7 ms a target forward (272 parameters) while nothing they check changes between the
    calls of a compiled shape (same module, dtype, cache tensors, inference mode). Dynamo then checks only the
    guards that tell this code object's graphs apart (`skip_guard_eval_unsafe`), and refuses to compile a call
    (a RuntimeError, not a graph silently compiled without our options). After a compile the new graph's packed
    weights are shared with earlier graphs' equal ones (eagle/compiled/shared_constants.py). draft: the graph
    is the draft head's, whose weights may be read approximately (`compile_options`)."""
    if compiling:
        return _compiling(modules, threads, draft)
    return torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)


def threads_match(compiled_at: int) -> bool:
    """Whether the calling thread may run graphs compiled at `compiled_at` torch threads.

    Dynamo keys a graph by the caller's `torch.get_num_threads()` (inductor builds the count into its C++
    loops), so a call at another count would compile every graph again, and under `compiled_call`'s stance
    fails instead. A runner's graphs compile at the count its model was built with; at another count (the
    user changed it after loading) its forwards run eagerly, said once."""
    threads = torch.get_num_threads()
    if threads == compiled_at:
        return True
    if (compiled_at, threads) not in _WARNED:
        _WARNED.add((compiled_at, threads))
        log.warning("torch runs %d threads, the decoder's graphs were compiled at %d: decoding eagerly (slower) "
                    "until the count is set back (torch.set_num_threads(%d)) or the model is loaded again",
                    threads, compiled_at, compiled_at)
    return False


@contextlib.contextmanager
def _compiling(modules: tuple[nn.Module, ...], threads: int | None, draft: bool):
    """Our options while a graph compiles, with no forward of a model in another thread meanwhile; then
    its packed weights shared with the graphs before it
    (eagle/compiled/shared_constants.py), and no second copy of the graph kept for torch's
    `save_cache_artifacts` (`_unrecorded`)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:  # no eager forward beside a compile (eagle/common/forward_lock.py)
        with one_forward(), inductor.patch(**compile_options(*modules, draft=draft)), sharing(), _unrecorded():
            yield
    finally:
        torch.set_num_threads(before)


def _unrecorded() -> contextlib.AbstractContextManager:
    """Torch records every graph it writes to or reads from its caches, pickled with its constants, in case
    the process calls `torch.compiler.save_cache_artifacts()`: one more copy of a target's packed weights
    per graph, for the process's life. Our graphs are cached on disk already; drop the record."""
    try:
        from torch.compiler._cache import CacheArtifactManager
    except ImportError:
        return contextlib.nullcontext()
    return CacheArtifactManager.with_fresh_cache()


MATMULS = ("template", "autotune", "aten")  # EAGLE_MATMULS: how our graphs lower their matmuls


def compile_options(*modules: nn.Module, draft: bool = False) -> dict:
    """Inductor settings of a graph over `modules`' weights. `freezing`: the weights become graph
    constants. The matmuls follow EAGLE_MATMULS (`matmuls_policy`):

    - `template` (default): inductor's C++ GEMM template wherever it serves the matmul, ATen's kernel
      elsewhere, without timing either. As fast as autotuning or faster at every width our forwards
      use (docs/speed.md), it compiles a fifth sooner, and its pick cannot depend on how busy the
      machine was while it compiled.
    - `autotune`: each matmul times the template against ATen's and keeps the faster.
    - `aten`: ATen's matmuls, no template: the test suite's tiny models compile in a fraction of the time.

    Under any of them, linear layers take our GEMV where it pays (eagle/compiled/gemv.py, EAGLE_GEMV): bf16 ones, or fp32
    ones over bf16-valued weights on a CPU without bf16 arithmetic; over CPU weights, the target's attention takes
    our kernel (eagle/compiled/attention_kernel.py, EAGLE_ATTENTION), built here before the trace. A `draft`
    graph (the draft head's) reads its weights as int8 where `gemv.int8_drafts()`: the draft proposes, the
    target's verify decides, so the output stays the target's. Another graph's lm_head (`output_weight`) screens
    in greedy steps where `gemv.screens()` (eagle/compiled/gemv.py `screened_argmax`).

    Without the template hook (`install_template_gemm`) graphs keep oneDNN prepacking, uncached.

    `epilogue_fusion` off: no pointwise work fused into the template's output loop. Fused, a head graph whose
    residual add also fed the scorer's row gather failed to compile ("wrong ndim": the template wrote both with
    its own 2-D index), so on CPUs without our GEMV the draft head decoded eagerly. Unfused, the target's
    forwards give the same bits in about the same time (fp32, AVX2, 2 threads: 0.98-1.04x; docs/speed.md).

    `cpp_wrapper` (`cpp_wrapper_wanted`): a graph over CPU weights calls its kernels from generated C++
    instead of Python; a forward is hundreds of small kernels, whose Python calls and allocations cost
    milliseconds. On a 2-core AVX512F Xeon (fp32) a compiled forward of 1 / 4 rows takes 0.89x / 0.82x as long
    as with the Python wrapper (docs/speed.md); a graph's first compile takes 2-3x longer, a cached one about
    as long."""
    policy = matmuls_policy()
    if on_cpu(*modules):  # before the trace, which asks whether the kernel is there
        attention_kernel.ensure_built()
    screen = None if draft or not gemv.screens() else output_weight(*modules)
    options = {"freezing": True, "cpp_wrapper": cpp_wrapper_wanted(*modules), "epilogue_fusion": False,
               **weights_key(*modules, policy=policy, use_gemv=gemv.active(), int8=draft and gemv.int8_drafts(),
                             screen=screen)}
    if policy != "aten":
        options.update(max_autotune=True, max_autotune_gemm_backends="CPP,ATEN")
    if install_template_gemm():
        options["cpp.weight_prepack"] = False
    return options


def output_weight(*modules: nn.Module) -> torch.Tensor | None:
    """The lm_head weight [V, H] of the first of `modules` that has one (HF's `get_output_embeddings`), or None."""
    for module in modules:
        head = module.get_output_embeddings() if hasattr(module, "get_output_embeddings") else None
        if isinstance(getattr(head, "weight", None), torch.Tensor):
            return head.weight
    return None


def matmuls_policy() -> str:
    return env_choice("EAGLE_MATMULS", "template", MATMULS)


def cpp_wrapper_wanted(*modules: nn.Module) -> bool:
    """Whether a graph over `modules` calls its kernels from C++: EAGLE_CPP_WRAPPER ("1", the default, or
    "0"), for weights on the CPU only (GPU graphs keep inductor's default)."""
    return env_choice("EAGLE_CPP_WRAPPER", "1", ("1", "0")) == "1" and on_cpu(*modules)


def on_cpu(*modules: nn.Module) -> bool:
    """Whether every weight of `modules` is on the CPU."""
    return all(p.device.type == "cpu" for m in modules for p in m.parameters())


def install_template_gemm() -> bool:
    """Let inductor's matmul lowerings offer the C++ GEMM template while `cpp.weight_prepack` is off, and
    take it untimed in our `template` graphs (idempotent). False when this torch has no such hooks:
    graphs then keep oneDNN prepacking."""
    try:
        from torch._inductor.kernel import mm as lowering
    except ImportError:
        return False
    current = getattr(lowering, "use_cpp_gemm_template", None)
    select = getattr(lowering, "autotune_select_algorithm", None)
    if current is None or select is None:
        return False
    if not hasattr(current, "eagle_wraps"):
        def offered(*args, **kwargs):
            with inductor.patch({"cpp.weight_prepack": True}):  # the template's own gate, nothing else
                return current(*args, **kwargs)

        offered.eagle_wraps = current
        lowering.use_cpp_gemm_template = offered
    if not hasattr(select, "eagle_wraps"):
        def template_first(name, choices, *args, **kwargs):
            ours = inductor.post_grad_custom_post_pass
            if isinstance(ours, _WeightsKey) and ours.policy == "template":
                templates = [c for c in choices if _is_cpp_template(c)]
                choices = templates or choices  # one choice: inductor takes it without timing
            return select(name, choices, *args, **kwargs)

        template_first.eagle_wraps = select
        lowering.autotune_select_algorithm = template_first
    return True


def _is_cpp_template(choice) -> bool:
    """The template's choice, bare (mm) or wrapped with the bias's pre- and post-processing (addmm)."""
    from torch._inductor.codegen.cpp_template_kernel import CppTemplateCaller

    return isinstance(getattr(choice, "_wrapped", choice), CppTemplateCaller)


class _WeightsKey(CustomGraphPass):
    """Our graphs' post-grad pass: linear layers to our GEMV when `use_gemv` (eagle/compiled/gemv.py; over int8
    weights when `int8`; `screen`: the lm_head weight to screen in greedy steps), nothing else. Its uuid (the
    weights' digest, the matmul policy, the GEMV's) joins the FX graph cache key, and its presence marks a graph as
    ours to the template hook."""

    def __init__(self, digest: str, policy: str, use_gemv: bool = False, int8: bool = False,
                 screen: torch.Tensor | None = None):
        self.digest, self.policy, self.use_gemv, self.int8, self.screen = digest, policy, use_gemv, int8, screen

    def __call__(self, graph: torch.fx.Graph) -> None:
        if self.use_gemv:
            gemv.rewrite_linears(graph, int8=self.int8, screen=self.screen)

    def uuid(self) -> str:
        gemv_key = f"-{gemv.key(self.int8, self.screen is not None)}" if self.use_gemv else ""
        return f"{self.digest}-{self.policy}-{attention_kernel.key()}{gemv_key}"


def weights_key(*modules: nn.Module, policy: str = "template", use_gemv: bool = False, int8: bool = False,
                screen: torch.Tensor | None = None) -> dict:
    """Inductor options that key the graphs compiled for `modules` by their weights (`weights_digest`)
    and by how their matmuls are chosen."""
    digest = "-".join(weights_digest(m) for m in modules)
    return {"post_grad_custom_post_pass": _WeightsKey(digest, policy, use_gemv, int8, screen)}


def weights_digest(module: nn.Module) -> str:
    """Digest of a module's parameters and buffers: names, shapes, dtypes, where each lies in its storage (a
    graph may read a joined weight's siblings through it) and a strided sample of up to SAMPLE elements of each
    (any retraining or fine-tuning changes the samples). Computed once per module object; weights changed in
    place afterwards are not seen."""
    if module not in _DIGESTS:
        h = hashlib.sha256()
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            flat = t.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // SAMPLE)].cpu().contiguous()
            layout = f"{t.storage_offset()}/{t.untyped_storage().nbytes()}"  # joined siblings: sibling_weights.py
            h.update(f"{name}:{tuple(t.shape)}:{t.dtype}:{layout}".encode())
            h.update(sample.view(torch.uint8).numpy().tobytes() if sample.numel() else b"")
        _DIGESTS[module] = h.hexdigest()
    return _DIGESTS[module]
