"""Compiled graphs reused across processes (eagle/compiled/graph_cache.py): cached at all, keyed by weights;
our options only while a shape compiles."""

import pytest
import torch
import torch._dynamo
import torch._inductor.config as inductor
from torch import nn
from torch._dynamo.utils import counters
from torch._inductor.utils import fresh_cache

from eagle.compiled.graph_cache import compile_options, compiled_call, weights_digest


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
    matmuls autotuned, as outside the test suite."""
    monkeypatch.setenv("EAGLE_AUTOTUNE", "1")
    torch._dynamo.reset()
    counters.clear()
    with fresh_cache():
        yield lambda event: counters["inductor"][event]
    torch._dynamo.reset()


def test_the_same_weights_compiled_again_are_a_cache_hit_with_the_cpp_template(inductor_counts):
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


def test_eagle_autotune_0_compiles_without_timing_kernels(monkeypatch):
    monkeypatch.setenv("EAGLE_AUTOTUNE", "0")
    options = compile_options(_mlp(0))
    assert options["freezing"] and "max_autotune" not in options
    monkeypatch.setenv("EAGLE_AUTOTUNE", "1")
    assert compile_options(_mlp(0))["max_autotune"]
