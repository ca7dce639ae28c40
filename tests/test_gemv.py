"""eagle/compiled/gemv.py: linear layers through our GEMV kernel (EAGLE_GEMV): bf16 ones where the CPU has AVX512-BF16,
fp32 ones over bf16-valued weights where it has AVX512F, or AVX2 and FMA, and no bf16 arithmetic."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from eagle.common.native_build import cpu_flags
from eagle.compiled import gemv, int8_codes
from eagle.model import EaModel
from tests.tiny import FIXED, hf_greedy, prompt, random_eagle3_head, tiny_llama

needs_kernel = pytest.mark.skipif("avx512_bf16" not in cpu_flags(), reason="the kernel needs AVX512-BF16")
needs_f32_kernel = pytest.mark.skipif(not gemv.f32_capable(cpu_flags()), reason="the fp32 kind needs AVX512F or AVX2")


# (rows, inputs, outputs): row counts through one pass (4 or 3 output rows at a time) and two, inputs not a
# multiple of a register's lanes, outputs not of a task's rows
SHAPES = ((1, 64, 16), (2, 96, 37), (3, 40, 5), (4, 128, 130), (5, 576, 33), (7, 576, 35), (8, 200, 64), (13, 7, 70),
          (16, 96, 19))
PAIRED_SHAPES = ((1, 8, 2), (2, 64, 18), (3, 40, 6), (5, 576, 34), (6, 96, 20), (7, 576, 36), (9, 200, 10),
                 (13, 16, 70), (16, 96, 22))  # what the AVX2 form packs: even outputs, inputs a multiple of 8
INT8_SHAPES = tuple(s for s in PAIRED_SHAPES if s[1] % 16 == 0) + ((1, 16, 2), (3, 48, 6), (9, 1728, 10))  # 16s


def _bf16(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).to(torch.bfloat16)


@needs_kernel
def test_the_kernel_multiplies_as_a_float_matmul_rounded_to_bf16():
    """Any row count (input rows in groups of up to 8, 4 or 3 output rows at a time), inputs not a multiple of 32,
    outputs not of 16."""
    assert gemv.kernel() is not None
    torch.manual_seed(0)
    for rows, inputs, outputs in SHAPES:
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
def test_sibling_weights_joined_give_the_same_bits():
    """q, k and v (or gate and up) as one weight [q + k + v, I]: each output is the same sum, so joining siblings
    (what experiments/gemv_roofline.py times as `gemv_siblings`) cannot change a decoding."""
    gemv.kernel()
    torch.manual_seed(2)
    for rows in (1, 3, 8):
        x = _bf16(rows, 96)
        parts = [_bf16(32, 96), _bf16(11, 96), _bf16(11, 96)]
        joined = torch.ops.eagle.gemv_linear(x, torch.cat(parts), 64)
        assert torch.equal(joined, torch.cat([torch.ops.eagle.gemv_linear(x, w, 64) for w in parts], dim=1))


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
    ({"avx512_bf16", "amx_bf16"}, "1", True), ({"avx512_bf16"}, "0", False), (set(), "1", False),
    (gemv.F32_FLAGS, "auto", True), (gemv.F32_FLAGS, "0", False), ({"avx512f", "avx2"}, "auto", False),
    (gemv.AVX2_FLAGS, "auto", True), ({"avx2"}, "auto", False)])
def test_the_kernel_is_wanted_without_amx_unless_told(monkeypatch, flags, choice, expected):
    """Default `auto`: on with AVX512-BF16 and no AMX (where oneDNN's AMX path beat a kernel of this kind), and in
    its fp32 kind on AVX512F/BW/VL, or AVX2 with FMA, without bf16 arithmetic."""
    monkeypatch.setattr(gemv, "cpu_flags", lambda: flags)
    monkeypatch.setenv("EAGLE_GEMV", choice)
    assert gemv.wanted() is expected
    assert gemv.kind() == (None if not expected else "bf16" if "avx512_bf16" in flags else "f32")


def test_a_bad_setting_is_named(monkeypatch):
    monkeypatch.setenv("EAGLE_GEMV", "yes")
    with pytest.raises(ValueError, match="EAGLE_GEMV='yes'"):
        gemv.wanted()


def _compiled_code(fn, *args, options: dict) -> str:
    """The Python inductor generates for `fn(*args)` compiled under `options`, without the FX graph cache."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False, **options), torch.no_grad():
        _, code = run_and_get_code(torch.compile(fn, fullgraph=True, dynamic=False), *args)
    return "\n".join(code)


def _gemv_calls(code: str) -> int:
    """Calls of our ops in a graph's generated code (the lm_head's may be the screened one): from its Python
    wrapper or from its C++ one."""
    return sum(code.count(f"torch.ops.eagle.{op}.default(") + code.count(f'_dispatcher("eagle::{op}"')
               for op in ("gemv_linear", "gemv_screened_linear"))


@needs_kernel
def test_our_graphs_take_the_kernel_for_bf16_linears_only(monkeypatch):
    """Frozen weights (our decoder's graphs) and weights as graph inputs; fp32 stays on ATen."""
    from eagle.compiled.graph_cache import compile_options

    monkeypatch.setenv("EAGLE_GEMV", "1")
    for dtype, expected in ((torch.bfloat16, 15), (torch.float32, 0)):  # 2 layers x 7 linears + the lm_head
        model = tiny_llama(seed=4, dtype=dtype)
        ids = prompt(1, 6)
        frozen = _compiled_code(lambda i: model(input_ids=i).logits, ids, options=compile_options(model))
        inputs = _compiled_code(lambda i: model(input_ids=i).logits, ids,
                                options={**compile_options(model), "freezing": False})
        assert _gemv_calls(frozen) == expected, dtype
        assert _gemv_calls(inputs) == expected, dtype
    monkeypatch.setenv("EAGLE_GEMV", "0")
    assert "gemv_linear" not in _compiled_code(lambda i: model(input_ids=i).logits, ids,
                                               options=compile_options(tiny_llama(seed=4, dtype=torch.bfloat16)))


@needs_kernel
def test_joined_siblings_take_one_call_each_over_the_models_own_storage(monkeypatch):
    """q/k/v and gate/up joined (eagle/compiled/sibling_weights.py): 4 calls a layer, the same bits as 7, and the
    graph's constants are the model's weights (a view reaching over the siblings, no copy)."""
    from eagle.compiled import sibling_weights
    from eagle.compiled.graph_cache import compile_options

    monkeypatch.setenv("EAGLE_GEMV", "1")
    ids = prompt(1, 6)
    separate = tiny_llama(seed=4, dtype=torch.bfloat16)
    joined = tiny_llama(seed=4, dtype=torch.bfloat16)
    sibling_weights.join(joined, gemv.reads)
    logits = {}
    for name, model in (("separate", separate), ("joined", joined)):
        torch._dynamo.reset()
        with torch._inductor.config.patch(fx_graph_cache=False, **compile_options(model)), torch.no_grad():
            compiled = torch.compile(lambda i, m=model: m(input_ids=i).logits, fullgraph=True, dynamic=False)
            logits[name] = compiled(ids)
    assert torch.equal(logits["joined"], logits["separate"])
    code = _compiled_code(lambda i: joined(input_ids=i).logits, ids, options=compile_options(joined))
    assert _gemv_calls(code) == 9  # 2 layers x 4 + the lm_head
    assert re.search(r"reinterpret_tensor\w*\(_frozen_param", code)  # a view of the model's own weight


@needs_kernel
def test_a_joined_graph_from_the_cache_reads_the_loading_models_own_weights(monkeypatch):
    """A second model loads the graph from inductor's cache; the graph reads that model's storage (a weight
    changed in place afterwards is seen), not a copy pickled with the graph."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import fresh_cache

    from eagle.compiled import sibling_weights
    from eagle.compiled.graph_cache import compile_options

    monkeypatch.setenv("EAGLE_GEMV", "1")
    ids = prompt(1, 6)
    with fresh_cache(), torch.no_grad():
        counters.clear()
        for _ in range(2):
            model = tiny_llama(seed=4, dtype=torch.bfloat16)
            sibling_weights.join(model, gemv.reads)
            torch._dynamo.reset()
            with torch._inductor.config.patch(**compile_options(model)):
                compiled = torch.compile(lambda i, m=model: m(input_ids=i).logits, fullgraph=True, dynamic=False)
                first = compiled(ids)
        assert counters["inductor"]["fxgraph_cache_hit"] == 1
        model.model.layers[1].self_attn.v_proj.weight.mul_(-1)  # the last block of a joined span
        changed = compiled(ids)
        eager = model(input_ids=ids).logits
    assert not torch.equal(changed, first)
    torch.testing.assert_close(changed.float(), eager.float(), rtol=0.05, atol=0.05)


@needs_kernel
def test_a_compiled_bf16_decoder_leaves_the_models_eager_forwards_alone(monkeypatch):
    """The target's modules stay as they are (HF generate and the eager runners keep ATen's matmuls); the compiled
    plain step's logits are close to eager ones."""
    monkeypatch.setenv("EAGLE_GEMV", "1")
    target = tiny_llama(seed=3, dtype=torch.bfloat16)
    head = random_eagle3_head(target).to(torch.bfloat16)
    ids = prompt(0, 12)
    with torch.no_grad():
        before = target(ids).logits
    model = EaModel(target, head, settings=FIXED, compile=True)
    out = model.naivegenerate(ids, max_new_tokens=8)
    with torch.inference_mode():
        assert torch.equal(target(ids).logits, before)
        assert all(type(m) is torch.nn.Linear for m in target.modules() if isinstance(m, torch.nn.Linear))
        step = model.compiled.plain_step(model.compiled, out[0, -1:], out.shape[1] - 1)
        expected = target(out).logits[0, -1]
    torch.testing.assert_close(step.float(), expected.float(), rtol=0.05, atol=0.05)


@needs_f32_kernel
def test_the_fp32_kind_multiplies_as_the_fp32_matmul_of_the_bf16_weights():
    """fp32 rows over bf16 weights: the fp32 products of those weights' values (sums in another order only);
    any row count, inputs not a multiple of 16, outputs not of 4; a row's bits never depend on its neighbours."""
    assert gemv.kernel() is not None
    torch.manual_seed(5)
    for rows, inputs, outputs in SHAPES + PAIRED_SHAPES:
        x, w = torch.randn(rows, inputs), _bf16(outputs, inputs)
        read = gemv.pack(w)  # the AVX2 form's pairs of rows; w itself in the AVX512 form
        if read is None:  # a shape the AVX2 form does not pack: its mms keep ATen's linear
            assert torch.equal(torch.ops.eagle.gemv_linear(x, w, 64), F.linear(x, w.float()))
            continue
        y = torch.ops.eagle.gemv_linear(x, read, 64)
        assert y.dtype == torch.float32 and y.shape == (rows, outputs)
        exact = F.linear(x.double(), w.double())  # the products of the bf16 weights' values, summed exactly
        bound = inputs * 2.0**-24 * F.linear(x.double().abs(), w.double().abs())  # fp32 sums in any order
        assert ((y.double() - exact).abs() <= bound).all(), (rows, inputs, outputs)
        for i in range(rows):
            assert torch.equal(torch.ops.eagle.gemv_linear(x[i:i + 1], read, 64), y[i:i + 1])
    x, w = torch.randn(2, 9, 64), _bf16(24, 64)  # 18 rows past the limit: ATen's linear over w widened to fp32
    assert torch.equal(torch.ops.eagle.gemv_linear(x, gemv.pack(w), 16), F.linear(x, w.float()))


@needs_f32_kernel
def test_packed_weights_hold_the_rows_in_pairs_of_8_inputs():
    """The AVX2 form's layout: pair p, inputs 8j..8j+7 as two halves of 4, each half rows 2p then 2p + 1; the
    op's output width from it."""
    gemv.kernel()
    w = torch.arange(4 * 16).reshape(4, 16).to(torch.bfloat16)  # [O 4, I 16]
    read = gemv.pack(w)
    assert (gemv.out_features(read), gemv.in_features(read)) == (4, 16)
    if read is w:  # the AVX512 form reads rows as they are
        return
    assert read.shape == (2, 2, 2, 2, 4) and read.is_contiguous()
    assert torch.equal(read[1, 0, 0, 0], w[2, :4]) and torch.equal(read[1, 0, 1, 1], w[3, 4:8])
    assert torch.equal(read[0, 1, 1, 0], w[0, 12:]) and torch.equal(read[1, 1, 0, 1], w[3, 8:12])
    assert gemv.pack(w[:3]) is None and gemv.pack(w[:, :12]) is None


@needs_f32_kernel
@pytest.mark.parametrize("cpp_wrapper", ["0", "1"])
def test_fp32_graphs_read_bf16_valued_weights_as_bf16(monkeypatch, cpp_wrapper):
    """Under the fp32 kind a frozen fp32 weight whose values are all bf16 values (a bf16 checkpoint loaded in
    fp32) is read through its bf16 copy; other fp32 weights and unfrozen ones stay on ATen and the template;
    the graph's kernels called from Python or from C++ (graph_cache.cpp_wrapper_wanted)."""
    from eagle.compiled import sibling_weights
    from eagle.compiled.graph_cache import compile_options

    monkeypatch.setattr(gemv, "cpu_flags", lambda: set(gemv.F32_FLAGS))
    monkeypatch.setenv("EAGLE_GEMV", "auto")
    monkeypatch.setenv("EAGLE_CPP_WRAPPER", cpp_wrapper)
    ids = prompt(1, 6)
    exact = tiny_llama(seed=4, dtype=torch.bfloat16).float()
    other = tiny_llama(seed=4, dtype=torch.float32)
    joined = tiny_llama(seed=4, dtype=torch.bfloat16).float()
    sibling_weights.join(joined, gemv.reads)  # one bf16 copy of each joined span: 2 layers x 4 calls + the lm_head
    for model, expected in ((exact, 15), (other, 0), (joined, 9)):  # 2 layers x 7 linears + the lm_head
        code = _compiled_code(lambda i: model(input_ids=i).logits, ids, options=compile_options(model))
        assert _gemv_calls(code) == expected
        assert ("cpp_wrapper_src" in code) == (cpp_wrapper == "1")  # a C++ wrapper's source in the module
    inputs = _compiled_code(lambda i: exact(input_ids=i).logits, ids,
                            options={**compile_options(exact), "freezing": False})
    assert "gemv_linear" not in inputs


@needs_f32_kernel
def test_a_compiled_fp32_decoder_over_bf16_weights_decodes_as_eager_greedy(monkeypatch):
    """Lossless in fp32: EAGLE decoding and plain steps through the kernel give HF's greedy tokens; the tuner's
    cached budgets are keyed by the kernel's code (a changed kernel re-times them)."""
    from eagle.tuning.budget_cache import budget_key

    monkeypatch.setattr(gemv, "cpu_flags", lambda: set(gemv.F32_FLAGS))
    monkeypatch.setenv("EAGLE_GEMV", "auto")
    target = tiny_llama(seed=3, dtype=torch.bfloat16).float()
    head = random_eagle3_head(target).to(torch.bfloat16).float()  # its graphs (fc, layer, scorer) take the kernel too
    ids = prompt(0, 12)
    expected = hf_greedy(target, ids, 16)
    model = EaModel(target, head, settings=FIXED, compile=True)
    assert torch.equal(model.naivegenerate(ids, max_new_tokens=16), expected)
    assert torch.equal(model.eagenerate(ids, max_new_tokens=16), expected)
    assert budget_key(model, [8], [2])["gemv"] == gemv.key(gemv.int8_drafts(), gemv.screens())
    monkeypatch.setenv("EAGLE_GEMV", "0")
    assert budget_key(model, [8], [2])["gemv"] == "off"


needs_int8_form = pytest.mark.skipif(not gemv.AVX2_FLAGS <= cpu_flags() or gemv.F32_FLAGS <= cpu_flags(),
                                     reason="the int8 form is the AVX2 form's (built where the CPU has no AVX512)")


@needs_int8_form
def test_int8_weights_multiply_as_their_codes_times_the_row_scales():
    """`int8_pack`'s codes in pairs of rows and one scale a row; the op multiplies the input rows, rounded to 16-bit
    integers k (x ~ s_x k, s_x its largest |x| / kmax), by scale * codes, the integer sums exact; any row count up
    to the limit, and past it, or for a row not finite, the graph's exact fp32 w^T."""
    assert gemv.kernel() is not None and gemv.kernel().packed()
    torch.manual_seed(6)
    for rows, inputs, outputs in INT8_SHAPES:
        w, x = torch.randn(outputs, inputs), torch.randn(rows, inputs)
        codes, scale = int8_codes.int8_pack(w)
        assert codes.dtype == torch.int8 and codes.shape == (outputs // 2, inputs // 16, 2, 16)
        q = codes.permute(0, 2, 1, 3).reshape(outputs, inputs).double()  # [O, I]
        read = q * scale.double()[:, None]
        assert ((read - w.double()).abs() <= scale.double()[:, None] / 2 + 1e-6).all()  # half a step a weight
        y = torch.ops.eagle.gemv_int8_linear(x, codes, scale, 16, w.t())
        kmax = min(16383, (2**31 - 1) // (127 * inputs))  # 127 kmax I < 2^31: the integer sums are exact
        sx = x.double().abs().amax(dim=1, keepdim=True) / kmax  # [M, 1]: the input rows' integer steps
        exact = F.linear(x.double(), read)  # each input within half a step of s_x k (0.51: the division's rounding)
        bound = 0.51 * sx * F.linear(torch.ones_like(exact[:, :1]).expand(-1, inputs), read.abs()) + 1e-5 * exact.abs()
        assert y.shape == (rows, outputs) and ((y.double() - exact).abs() <= bound).all(), (rows, inputs, outputs)
        tiny = x * 1e-36  # integer steps |x|/kmax below the smallest normal float: that float is the step
        step = (tiny.double().abs().amax(dim=1, keepdim=True) / kmax).clamp(min=torch.finfo(torch.float32).tiny)
        scaled = torch.ops.eagle.gemv_int8_linear(tiny, codes, scale, 16, w.t()).double() * 1e36
        coarse = 0.51 * step * 1e36 * F.linear(torch.ones_like(exact[:, :1]).expand(-1, inputs), read.abs())
        assert ((scaled - exact).abs() <= coarse + 1e-4 * exact.abs()).all(), (rows, inputs, outputs)
    x, w = torch.randn(2, 9, 64), torch.randn(24, 64)  # 18 rows past the limit: the exact linear
    assert torch.equal(torch.ops.eagle.gemv_int8_linear(x, *int8_codes.int8_pack(w), 16, w.t()), x @ w.t())
    x[0, 0, 3] = float("nan")
    y = torch.ops.eagle.gemv_int8_linear(x[0], *int8_codes.int8_pack(w), 16, w.t())
    assert torch.equal(y.nan_to_num(), (x[0] @ w.t()).nan_to_num())  # a row not finite: the exact linear
    assert int8_codes.int8_pack(w[:3]) is None and int8_codes.int8_pack(w[:, :24]) is None
    zero = int8_codes.int8_pack(torch.zeros(2, 16))  # a row of zeros: codes 0, scale 1
    assert torch.equal(zero[1], torch.ones(2)) and not zero[0].any()


@needs_int8_form
def test_the_draft_reads_int8_weights_and_the_output_stays_the_targets(monkeypatch):
    """Under the fp32 kind the draft head's graphs (and only theirs) read int8 weights (EAGLE_DRAFT_INT8=auto), and
    greedy EAGLE decoding still gives HF's greedy tokens: the draft proposes, the target's verify decides.
    EAGLE_DRAFT_INT8=0 keeps the head's weights exact."""
    from eagle.compiled import graph_cache

    monkeypatch.setattr(gemv, "cpu_flags", lambda: set(gemv.AVX2_FLAGS))
    monkeypatch.setenv("EAGLE_GEMV", "auto")
    passes = []  # (int8, mms replaced) of each graph compiled
    rewrite = gemv.rewrite_linears
    monkeypatch.setattr(gemv, "rewrite_linears", lambda graph, int8=False, screen=None: passes.append(
        (int8, rewrite(graph, int8=int8, screen=screen))) or passes[-1][1])
    target = tiny_llama(seed=3, dtype=torch.bfloat16).float()
    head = random_eagle3_head(target).to(torch.bfloat16).float()
    ids = prompt(0, 12)
    expected = hf_greedy(target, ids, 16)
    for choice, int8 in (("auto", True), ("0", False)):
        monkeypatch.setenv("EAGLE_DRAFT_INT8", choice)
        passes.clear()
        torch._dynamo.reset()
        with torch._inductor.config.patch(fx_graph_cache=False):
            model = EaModel(target, head, settings=FIXED, compile=True)
            assert torch.equal(model.eagenerate(ids, max_new_tokens=16), expected)
        head_passes = [flag for flag, count in passes if flag]
        assert bool(head_passes) == int8 and len(passes) > len(head_passes)  # the target's graphs stay exact
        assert all(count > 0 for _, count in passes)
        uuid = graph_cache.compile_options(head, draft=True)["post_grad_custom_post_pass"].uuid()
        assert uuid.endswith("-" + gemv.key(int8)) and ("-int8-" in uuid) == int8  # its own inductor cache entries
        assert "-int8-" not in graph_cache.compile_options(target)["post_grad_custom_post_pass"].uuid()


def _screened(x: torch.Tensor, w16: torch.Tensor, packed: tuple, full: torch.Tensor, greedy: bool) -> torch.Tensor:
    with gemv.screened_argmax(greedy):
        return torch.ops.eagle.gemv_screened_linear(x, w16, *packed, 16, gemv.SCREEN_ROWS, full)


@needs_int8_form
def test_the_screen_keeps_each_rows_argmax_and_its_ties_exact(monkeypatch):
    """In a greedy step of up to SCREEN_ROWS rows the screened lm_head gives each row's candidates (every token
    that may be or tie the largest logit) the unscreened call's bits and the others -inf, so the argmax and its
    ties are the unscreened ones; outside greedy steps, past SCREEN_ROWS rows and for a row that is not finite it
    is the unscreened call."""
    monkeypatch.setenv("EAGLE_GREEDY_SCREEN", "auto")
    assert gemv.screens()
    torch.manual_seed(8)
    w = torch.randn(2048, 576).to(torch.bfloat16).float()
    w[901] = w[40]  # an exact tie wherever token 40 wins
    w16, packed, full = gemv.pack(w.to(torch.bfloat16)), int8_codes.screen_pack(w), w.t()
    assert packed[0].shape == (1024, 36, 2, 16) and packed[2].shape == (2, 2048)
    for rows in range(1, gemv.SCREEN_ROWS + 1):
        x = torch.randn(rows, 576) * torch.linspace(0.1, 8, 576)  # a few large channels, as hidden states have
        x[0] = w[40] * 3  # token 40 (and 901) win row 0
        exact = torch.ops.eagle.gemv_linear(x, w16, 16, full)
        y = _screened(x, w16, packed, full, greedy=True)
        kept = torch.isfinite(y)
        assert kept.sum(1).max() < 64 and torch.equal(y[kept], exact[kept])  # a handful, the same bits
        best = exact.max(dim=1, keepdim=True).values
        assert (kept >= (exact == best)).all()  # every tie of the largest kept
        assert torch.equal(y.argmax(1), exact.argmax(1)) and y[0].argmax() == 40 and kept[0, 901]
        assert torch.equal(_screened(x, w16, packed, full, greedy=False), exact)  # not greedy: unscreened
    tiny = torch.randn(2, 576) * 1e-36  # integer steps |x|/kmax below the smallest normal float: kept normal
    exact = torch.ops.eagle.gemv_linear(tiny, w16, 16, full)
    y = _screened(tiny, w16, packed, full, greedy=True)
    assert torch.equal(y.argmax(1), exact.argmax(1)) and torch.isfinite(y).sum(1).max() < 64
    x = torch.randn(gemv.SCREEN_ROWS + 1, 576)
    assert torch.equal(_screened(x, w16, packed, full, True), torch.ops.eagle.gemv_linear(x, w16, 16, full))
    x[0, 3] = float("nan")
    assert torch.equal(_screened(x[:1], w16, packed, full, True).isnan(),
                       torch.ops.eagle.gemv_linear(x[:1], w16, 16, full).isnan())
    monkeypatch.setenv("EAGLE_GREEDY_SCREEN", "0")  # off: never set
    assert torch.equal(_screened(x[1:2], w16, packed, full, True), torch.ops.eagle.gemv_linear(x[1:2], w16, 16, full))


@needs_int8_form
def test_greedy_steps_screen_the_targets_lm_head_and_decode_as_eager_greedy(monkeypatch):
    """Under the fp32 kind on an AVX2 CPU the target's graphs call the screened lm_head, the head's do not, and the
    kernel screens only inside greedy steps: greedy EAGLE and plain decoding give HF's greedy tokens."""
    from eagle.compiled import graph_cache

    monkeypatch.setattr(gemv, "cpu_flags", lambda: set(gemv.AVX2_FLAGS))
    monkeypatch.setenv("EAGLE_GEMV", "auto")
    monkeypatch.setenv("EAGLE_GREEDY_SCREEN", "auto")
    screened = []  # (graph's module, screened calls) of each graph compiled
    rewrite = gemv.rewrite_linears
    monkeypatch.setattr(gemv, "rewrite_linears", lambda graph, int8=False, screen=None: screened.append(
        (screen is not None, rewrite(graph, int8=int8, screen=screen))) or screened[-1][1])
    target = tiny_llama(seed=3, dtype=torch.bfloat16).float()
    head = random_eagle3_head(target).to(torch.bfloat16).float()
    ids = prompt(0, 12)
    expected = hf_greedy(target, ids, 16)
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False):
        model = EaModel(target, head, settings=FIXED, compile=True)
        assert torch.equal(model.eagenerate(ids, max_new_tokens=16), expected)
        assert torch.equal(model.naivegenerate(ids, max_new_tokens=16), expected)
    assert {flag for flag, _ in screened} == {True, False}  # the target's graphs, the head's
    code = _compiled_code(lambda i: target(input_ids=i).logits, ids, options=graph_cache.compile_options(target))
    assert code.count("gemv_screened_linear.default(") == 1 and _gemv_calls(code) == 9  # 2 layers x 4 (joined), lm_head
    key = graph_cache.compile_options(target)["post_grad_custom_post_pass"].uuid()
    assert key.endswith(gemv.key(False, screen=True)) and "-screen" in key
    assert "-screen" not in graph_cache.compile_options(head, draft=True)["post_grad_custom_post_pass"].uuid()
    ext = gemv.kernel()
    with gemv.screened_argmax(True):
        assert ext.set_screening(True)  # set within, and back to unset after
    assert not ext.set_screening(False)
