"""eagle/compiled/direct_call.py: a compiled graph's dynamo-transformed code called without dynamo's lookup, and
the compiled runners calling their shapes' graphs that way."""

from __future__ import annotations

import torch
import torch._dynamo

from eagle.compiled import direct_call
from eagle.compiled.target_graphs import CompiledTarget
from tests.tiny import prompt, tiny_llama


def _affine(x, scale=2.0):
    return x * scale + 1


class _Scaler(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4))

    def scaled(self, x):
        return x * self.weight


def test_the_newest_graph_runs_as_a_function_of_the_same_arguments():
    torch._dynamo.reset()
    compiled = torch.compile(_affine, fullgraph=True, dynamic=False)
    a, b = torch.randn(3), torch.randn(5)
    before = direct_call.graphs(_affine)
    compiled(a)
    first = direct_call.newest(_affine, before)
    assert first is not None and torch.equal(first(a), _affine(a))
    assert torch.equal(first(a, 3.0), _affine(a))  # it checks nothing: the graph's scale is the one it compiled
    before = direct_call.graphs(_affine)
    compiled(a)  # a shape compiled before: no new graph
    assert direct_call.newest(_affine, before) is None
    compiled(b)  # another shape: its own graph
    second = direct_call.newest(_affine, before)
    assert second is not None and torch.equal(second(b), _affine(b))
    torch._dynamo.reset()  # dynamo forgets its graphs; the functions keep theirs
    assert torch.equal(first(a), _affine(a))


def test_a_bound_method_graph_is_bound_to_its_object():
    torch._dynamo.reset()
    module = _Scaler()
    before = direct_call.graphs(module.scaled)
    x = torch.randn(4)
    with torch.no_grad():
        torch.compile(module.scaled, fullgraph=True, dynamic=False)(x)
        direct = direct_call.newest(module.scaled, before)
        assert direct is not None and torch.equal(direct(x), module.scaled(x))


def test_the_target_runner_calls_a_compiled_shape_without_dynamo():
    """After the call that compiles a shape, its later calls take the graph's code directly: dynamo's compiled
    function is not called again, and the outputs are the same."""
    runner = CompiledTarget(tiny_llama(seed=3))
    token = torch.tensor([5])
    with torch.inference_mode():
        runner.prefill(prompt(0, 12), 32)
        first = runner.plain_step(runner, token, 12).clone()
        assert runner._direct[(1, False)] is not None

        def dynamo_path(**kwargs):
            raise AssertionError("dynamo's lookup was taken for a compiled shape")

        runner._compiled = dynamo_path
        assert torch.equal(runner.plain_step(runner, token, 12), first)
