"""eagle/compiled/sibling_weights.py: each layer's q/k/v and gate/up weights as row blocks of one tensor, the
values and the model's behaviour unchanged."""

from __future__ import annotations

import copy

import torch
from transformers import AutoModelForCausalLM

from eagle.compiled import sibling_weights
from eagle.compiled.graph_cache import weights_digest
from eagle.compiled.shared_constants import _share_values
from tests.tiny import prompt, tiny_llama

EVERY = lambda weight: True  # noqa: E731 (join's `reads`: every weight)


def _groups(model):
    for layer in model.model.layers:
        yield [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]
        yield [layer.mlp.gate_proj, layer.mlp.up_proj]


def test_join_makes_siblings_one_storage_and_changes_no_value(tmp_path):
    model = tiny_llama(seed=2, dtype=torch.bfloat16)
    ids = prompt(0, 9)
    with torch.no_grad():
        before = model(ids).logits
    values = {name: p.clone() for name, p in model.named_parameters()}
    assert sibling_weights.join(model, EVERY) == 4  # 2 layers x (q/k/v, gate/up)
    for linears in _groups(model):
        weights = [linear.weight for linear in linears]
        assert sibling_weights.sibling_runs(weights) == [list(range(len(weights)))]
        assert all(isinstance(w, torch.nn.Parameter) for w in weights)
    for name, p in model.named_parameters():
        assert torch.equal(p, values[name]), name
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)
    assert sibling_weights.join(model, EVERY) == 0  # already joined
    model.save_pretrained(tmp_path)  # tensors sharing a storage: transformers saves each its own
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert all(torch.equal(p, values[name]) for name, p in loaded.named_parameters())


def test_only_bias_free_groups_of_weights_the_gemv_reads_are_joined():
    model = tiny_llama(seed=2, dtype=torch.bfloat16)
    assert sibling_weights.join(model, lambda weight: weight.shape[0] != 64) == 2  # gate/up (128 rows) only
    attention = model.model.layers[0].self_attn
    assert len(sibling_weights.sibling_runs([attention.q_proj.weight, attention.k_proj.weight])) == 2
    biased = tiny_llama(seed=2, dtype=torch.bfloat16)
    for layer in biased.model.layers:
        layer.mlp.up_proj.bias = torch.nn.Parameter(torch.zeros(128, dtype=torch.bfloat16))
    assert sibling_weights.join(biased, EVERY) == 2  # q/k/v only


def test_a_compiled_target_joins_nothing_its_graphs_do_not_give_the_gemv(monkeypatch):
    """fp32 weights of other values than bf16 ones stay apart: inductor's own matmuls read a joined weight from
    the wrong place (the verify's logits were off by 0.19), so such a target compiles as before, exact."""
    from eagle.compiled.target_graphs import CompiledTarget

    monkeypatch.setenv("EAGLE_MATMULS", "template")
    target, eager = tiny_llama(seed=3), tiny_llama(seed=3)
    runner = CompiledTarget(target)
    attention = target.model.layers[0].self_attn
    assert len(sibling_weights.sibling_runs([attention.q_proj.weight, attention.k_proj.weight])) == 2
    ids, tokens = prompt(0, 12), torch.tensor([5, 6, 7, 8])
    with torch.inference_mode():
        runner.prefill(ids, 32)
        out = runner.forward(tokens, torch.arange(12, 16), torch.ones(4, 4, dtype=torch.bool).tril(), 12, hidden=True)
        expected = eager(torch.cat([ids[0], tokens])[None]).logits[0, 12:]
    torch.testing.assert_close(out.logits[0, :4], expected, rtol=1e-4, atol=1e-4)


def test_sibling_runs_follow_the_storage():
    joined = torch.randn(10, 4)
    a, b, c = joined[0:3], joined[3:7], joined[7:10]
    alone = torch.randn(2, 4)
    assert sibling_weights.sibling_runs([a, b, c, alone]) == [[0, 1, 2], [3]]
    assert sibling_weights.sibling_runs([a, c]) == [[0], [1]]  # a gap between them
    assert sibling_weights.sibling_runs([b, a]) == [[0], [1]]  # out of order
    assert sibling_weights.sibling_runs([a, joined[3:6, :2]]) == [[0], [1]]  # another width


def test_a_joined_model_is_keyed_apart_from_the_same_values_unjoined():
    """A graph that reads past a weight's rows must never be served to a model whose weights are not joined."""
    model = tiny_llama(seed=2, dtype=torch.bfloat16)
    joined = copy.deepcopy(model)
    sibling_weights.join(joined, EVERY)
    again = copy.deepcopy(model)
    sibling_weights.join(again, EVERY)
    assert weights_digest(joined) != weights_digest(model)
    assert weights_digest(joined) == weights_digest(again)


def test_shared_constants_never_swap_a_part_of_a_larger_storage():
    whole = torch.randn(512, 1024)  # 2 MB
    part = torch.cat([whole, torch.randn(4, 1024)])[:512]  # equal values, inside a larger storage
    kept: dict = {}
    _share_values({"w": whole}, kept.__setitem__)
    _share_values({"w": part}, kept.__setitem__)
    assert "w" not in kept  # `part` keeps its own tensor
    copy_of_whole = whole.clone()
    _share_values({"w": copy_of_whole}, kept.__setitem__)
    assert kept["w"] is whole
