"""Compiled graphs reused across processes (eagle/compiled/graph_cache.py): cached at all, keyed by weights;
our options only while a shape compiles; one packed copy of each weight for all graphs."""

import contextlib
import copy
import gc

import pytest
import torch
import torch._dynamo
import torch._inductor.config as inductor
from torch import nn
from torch._dynamo.utils import counters
from torch._inductor.utils import fresh_cache

from eagle.compiled import attention_kernel, gemv
from eagle.compiled.graph_cache import compile_options, compiled_call, matmuls_policy, weights_digest


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).to(torch.bfloat16).eval()


def _compiled(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """module(x) compiled as a one-row graph with our options (each new module object compiles again)."""
    with torch.inference_mode(), inductor.patch(**compile_options(module)):
        return torch.compile(module, fullgraph=True, dynamic=False)(x)


@pytest.fixture
def inductor_counts(monkeypatch):
    """An empty inductor cache for the test, and a count of inductor's events (compiling replaces the counter);
    the matmuls of the default policy, as outside the test suite."""
    monkeypatch.setenv("EAGLE_MATMULS", "template")
    torch._dynamo.reset()
    counters.clear()
    with fresh_cache():
        yield lambda event: counters["inductor"][event]
    torch._dynamo.reset()


@pytest.mark.parametrize("cpp_wrapper", ["0", "1"])
def test_the_same_weights_compiled_again_are_a_cache_hit_with_the_cpp_template(inductor_counts, monkeypatch,
                                                                               cpp_wrapper):
    monkeypatch.setenv("EAGLE_CPP_WRAPPER", cpp_wrapper)  # kernels called from Python or from C++
    x = torch.randn(1, 64, dtype=torch.bfloat16)
    first = _compiled(_mlp(0), x)
    assert inductor_counts("fxgraph_cache_miss") == 1  # not "bypass": no oneDNN-packed weights in the graph
    assert inductor_counts("cpp_templated_kernel_counter") > 0  # the C++ GEMM template without prepacking
    second = _compiled(_mlp(0), x)  # another module object: dynamo traces again, inductor's cache answers
    assert inductor_counts("fxgraph_cache_hit") == 1
    torch.testing.assert_close(second, first, rtol=0, atol=0)


def test_a_module_of_the_same_shapes_with_other_weights_never_runs_the_cached_weights(inductor_counts):
    # the cache keys frozen weights by shape, and the template's packed copies of them live in the cached graph
    x = torch.randn(1, 64, dtype=torch.bfloat16)
    _compiled(_mlp(0), x)
    other = _mlp(1)
    out = _compiled(other, x)
    assert inductor_counts("fxgraph_cache_hit") == 0
    torch.testing.assert_close(out, other(x), rtol=0.02, atol=0.02)


def test_weights_digest_sees_a_changed_weight_and_only_that():
    assert weights_digest(_mlp(0)) == weights_digest(_mlp(0))
    changed = _mlp(0)
    with torch.no_grad():
        changed[2].bias[5] += 1
    assert weights_digest(changed) != weights_digest(_mlp(0))


def test_calls_of_compiled_shapes_skip_our_options_and_a_shape_not_declared_compiling_fails():
    torch._dynamo.reset()
    module, seen = _mlp(0), []

    def backend(graph, inputs):  # records the inductor options each graph compiles under
        seen.append(inductor.freezing)
        return graph.forward

    f = torch.compile(lambda x: x * 2, backend=backend, fullgraph=True, dynamic=False)
    for n in (2, 3):
        with compiled_call(True, module):
            f(torch.ones(n))
    assert seen == [True, True]
    with compiled_call(False, module):
        assert not inductor.freezing
        torch.testing.assert_close(f(torch.ones(3)), torch.full((3,), 2.0))
    with pytest.raises(Exception, match="[Rr]ecompil"), compiled_call(False, module):
        f(torch.ones(4))  # would compile without freezing: fails instead
    assert seen == [True, True]
    torch._dynamo.reset()


class _Gram(nn.Module):
    """A linear layer (frozen weight: the template serves it) and a product of two activations (it cannot)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(64, 32)

    def forward(self, x):
        h = self.proj(x)
        return h @ h.T


def test_template_policy_takes_the_template_untimed_and_aten_where_the_template_cannot_serve(inductor_counts):
    module, x = _Gram().eval(), torch.randn(4, 64)
    with torch.inference_mode(), inductor.patch(**compile_options(module)):
        out = torch.compile(module, fullgraph=True, dynamic=False)(x)
    assert inductor_counts("cpp_templated_kernel_counter") == 1  # the linear layer
    assert inductor_counts("select_algorithm_autotune") == 0  # no kernel timed
    with torch.inference_mode():
        torch.testing.assert_close(out, module(x), rtol=1e-4, atol=1e-4)


def test_autotune_policy_times_the_template_against_aten(inductor_counts, monkeypatch):
    monkeypatch.setenv("EAGLE_MATMULS", "autotune")
    module, x = _Gram().eval(), torch.randn(4, 64)
    with torch.inference_mode(), inductor.patch(**compile_options(module)):
        torch.compile(module, fullgraph=True, dynamic=False)(x)
    assert inductor_counts("select_algorithm_autotune") >= 1


def test_matmul_policies_and_a_wrong_one(monkeypatch):
    monkeypatch.setenv("EAGLE_MATMULS", "aten")
    options = compile_options(_mlp(0))
    assert options["freezing"] and "max_autotune" not in options
    monkeypatch.setenv("EAGLE_MATMULS", "template")
    assert compile_options(_mlp(0))["max_autotune"]
    # the policy (and the GEMV's and the attention's) joins the cache key: a graph cached under one is never served
    # under another
    monkeypatch.setenv("EAGLE_GEMV", "0")
    attention = attention_kernel.key()
    assert compile_options(_mlp(0))["post_grad_custom_post_pass"].uuid().endswith(f"-template-{attention}")
    monkeypatch.setenv("EAGLE_GEMV", "1")
    assert compile_options(_mlp(0))["post_grad_custom_post_pass"].uuid().endswith(f"-template-{attention}" + (
        f"-{gemv.key()}" if gemv.active() else ""))
    monkeypatch.setenv("EAGLE_ATTENTION", "0")
    assert "-template-sdpa" in compile_options(_mlp(0))["post_grad_custom_post_pass"].uuid()
    monkeypatch.setenv("EAGLE_MATMULS", "fastest")
    with pytest.raises(ValueError, match="EAGLE_MATMULS='fastest'"):
        matmuls_policy()


def _packed_copies(k: int, n: int) -> set[int]:
    """Storages of the live 3-D tensors of at least k*n elements: the template's packed [n/b, k, b] weights."""
    found = set()
    for o in gc.get_objects():
        with contextlib.suppress(ReferenceError):
            if type(o) is torch.Tensor and o.dim() == 3 and o.shape[1] == k and o.numel() >= k * n:
                found.add(o.untyped_storage().data_ptr())
    return found


@pytest.mark.parametrize("cpp_wrapper", ["0", "1"])
def test_graphs_of_several_widths_share_one_packed_copy_of_each_weight(inductor_counts, monkeypatch, cpp_wrapper):
    """The template packs a weight the same way at every width: one copy serves all graphs, built or loaded
    from the cache (eagle/compiled/shared_constants.py), their kernels called from Python or from C++; a module
    with other weights keeps its own."""
    from torch.compiler._cache import CacheArtifactManager

    monkeypatch.setenv("EAGLE_CPP_WRAPPER", cpp_wrapper)

    torch.manual_seed(0)
    wide, other = nn.Linear(512, 1024).eval(), nn.Linear(512, 1024).eval()
    compiled = []
    with CacheArtifactManager.with_fresh_cache():
        for module in (wide, copy.deepcopy(wide), other):  # the copy: cache hits for the same weights
            torch._dynamo.reset()
            for rows in (1, 4):
                x = torch.randn(rows, 512)
                with torch.inference_mode(), compiled_call(True, module):
                    compiled.append(torch.compile(module, fullgraph=True, dynamic=False))
                    torch.testing.assert_close(compiled[-1](x), module(x), rtol=1e-4, atol=1e-4)
        assert not CacheArtifactManager.need_serialize()  # no pickled copy of each graph kept for torch
    assert inductor_counts("fxgraph_cache_hit") == 2 and inductor_counts("cpp_templated_kernel_counter") > 0
    gc.collect()
    assert len(_packed_copies(512, 1024)) == 2  # wide's four graphs share one, other's two another
