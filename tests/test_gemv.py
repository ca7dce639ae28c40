"""eagle/compiled/gemv.py: bf16 linear layers through our GEMV kernel where the CPU has AVX512-BF16 (EAGLE_GEMV)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from eagle.common.native_build import cpu_flags
from eagle.compiled import gemv
from eagle.model import EaModel
from tests.tiny import FIXED, prompt, random_eagle3_head, tiny_llama

needs_kernel = pytest.mark.skipif("avx512_bf16" not in cpu_flags(), reason="the kernel needs AVX512-BF16")


def _bf16(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).to(torch.bfloat16)


@needs_kernel
def test_the_kernel_multiplies_as_a_float_matmul_rounded_to_bf16():
    """Any row count (input rows in groups of 4), inputs not a multiple of 32, outputs not of 16."""
    assert gemv.kernel() is not None
    torch.manual_seed(0)
    for rows, inputs, outputs in ((1, 64, 16), (2, 96, 37), (3, 40, 5), (4, 128, 130), (5, 576, 33), (13, 7, 70)):
        x, w = _bf16(rows, inputs), _bf16(outputs, inputs)
        y = torch.ops.eagle.gemv_linear(x, w, 64)
        expected = F.linear(x.float(), w.float())
        assert y.dtype == torch.bfloat16 and y.shape == (rows, outputs)
        torch.testing.assert_close(y.float(), expected, rtol=0.01, atol=0.02)  # bf16 rounding of fp32 sums


@needs_kernel
def test_a_row_comes_out_the_same_bits_alone_or_among_others():
    """A verify's rows equal a plain step's bit for bit: the sum of a row never depends on the rows beside it."""
    gemv.kernel()
    torch.manual_seed(1)
    x, w = _bf16(11, 200), _bf16(50, 200)
    together = torch.ops.eagle.gemv_linear(x, w, 64)
    for i in range(11):
        assert torch.equal(torch.ops.eagle.gemv_linear(x[i:i + 1], w, 64), together[i:i + 1])


@needs_kernel
def test_rows_past_the_limit_and_other_dtypes_take_atens_linear():
    gemv.kernel()
    torch.manual_seed(2)
    x, w = _bf16(2, 9, 64), _bf16(24, 64)  # 18 rows, leading dims kept
    assert torch.equal(torch.ops.eagle.gemv_linear(x, w, 16), F.linear(x, w))
    assert torch.ops.eagle.gemv_linear(x, w, 32).shape == (2, 9, 24)
    x32, w32 = x.float(), w.float()
    assert torch.equal(torch.ops.eagle.gemv_linear(x32, w32, 64), F.linear(x32, w32))


@pytest.mark.parametrize(("flags", "choice", "expected"), [
    ({"avx512_bf16"}, "auto", True), ({"avx512_bf16", "amx_bf16"}, "auto", False),
    ({"avx512_bf16", "amx_bf16"}, "1", True), ({"avx512_bf16"}, "0", False), (set(), "1", False)])
def test_the_kernel_is_wanted_without_amx_unless_told(monkeypatch, flags, choice, expected):
    """Default `auto`: on with AVX512-BF16 and no AMX (where oneDNN's AMX path beat a kernel of this kind)."""
    monkeypatch.setattr(gemv, "cpu_flags", lambda: flags)
    monkeypatch.setenv("EAGLE_GEMV", choice)
    assert gemv.wanted() is expected


def test_a_bad_setting_is_named(monkeypatch):
    monkeypatch.setenv("EAGLE_GEMV", "yes")
    with pytest.raises(ValueError, match="EAGLE_GEMV='yes'"):
        gemv.wanted()


@needs_kernel
def test_only_bias_free_bf16_linears_are_routed_and_can_be_restored(monkeypatch):
    monkeypatch.setenv("EAGLE_GEMV", "1")
    model = torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False), torch.nn.Linear(32, 8), torch.nn.ReLU()).to(
        torch.bfloat16)
    keys, x = list(model.state_dict()), _bf16(3, 64)
    before = model(x).float()
    assert gemv.route_linears(model) and gemv.routed(model)
    assert type(model[0]) is gemv.GemvLinear and type(model[1]) is torch.nn.Linear  # a bias: not routed
    assert isinstance(model[0], torch.nn.Linear) and list(model.state_dict()) == keys
    torch.testing.assert_close(model(x).float(), before, rtol=0.02, atol=0.02)
    gemv.unroute_linears(model)
    assert not gemv.routed(model) and type(model[0]) is torch.nn.Linear
    assert not gemv.route_linears(tiny_llama())  # fp32: ATen's matmuls, exact
    monkeypatch.setenv("EAGLE_GEMV", "0")
    assert not gemv.route_linears(model)


@needs_kernel
def test_a_compiled_bf16_decoder_routes_target_and_head_and_keys_its_tuned_budgets(monkeypatch):
    """The compiled graphs call the op (dynamic verify rows included), their logits close to eager ATen's."""
    from eagle.tuning.budget_cache import budget_key

    monkeypatch.setenv("EAGLE_GEMV", "1")
    target = tiny_llama(seed=3, dtype=torch.bfloat16)
    head = random_eagle3_head(target).to(torch.bfloat16)
    ids = prompt(0, 12)
    with torch.no_grad():
        expected = target(ids).logits[0, -1].float()  # before routing: ATen's linears
    model = EaModel(target, head, settings=FIXED, compile=True)
    assert model.compiled.gemv and model.drafter.compiled.gemv and gemv.routed(target, head)
    logits, _ = model.compiled.plain_prefill(ids)
    torch.testing.assert_close(logits.float(), expected, rtol=0.05, atol=0.05)
    out = model.eagenerate(ids, max_new_tokens=12)
    assert out.shape[1] > ids.shape[1] and model.compiled.shapes  # verify graphs compiled over the op
    assert budget_key(model, [8], [2])["gemv"] is True
