"""`EaModel(compile=True)`: the target's forwards compiled over a bucketed static cache
(eagle/compiled/target_graphs.py; a one-row plain step, one dynamic-rows verify graph, both for every cache
length) give HF generate's greedy output in fp32, for plain decoding and for every tree kind, across cache
buckets; each graph compiles once."""

import logging

import pytest
import torch
from torch._dynamo.utils import counters
from transformers import MistralConfig, MistralForCausalLM

from eagle.compiled.target_graphs import ANY_ROWS, BUCKET, CompiledTarget, bucket, compilable, padded_mask
from eagle.model import EaModel
from eagle.decoding.eager_head import EagerHead
from eagle.decoding.eager_target import EagerTarget
from eagle.decoding.runners import HeadRunner, TargetRunner
from eagle.decoding.settings import TreeSettings
from eagle.decoding.tree import build_tree
from tests.tiny import FIXED, TREES, hf_greedy, near_bigram_pair, prompt, random_eagle3_head, random_head, tiny_llama


def test_buckets_double_from_256():
    assert [bucket(n) for n in (1, 256, 257, 700, 1025)] == [256, 256, 512, 1024, 2048] and BUCKET == 256


def test_decoders_compile_by_default_unless_told_not_to(monkeypatch):
    target = tiny_llama(seed=2)
    head = random_head(target)
    monkeypatch.delenv("EAGLE_COMPILE", raising=False)
    assert EaModel(target, head, settings=FIXED).compiled is not None
    assert EaModel(target, head, settings=FIXED, compile=False).compiled is None
    monkeypatch.setenv("EAGLE_COMPILE", "0")  # what the test suite runs with (tests/conftest.py)
    model = EaModel(target, head, settings=FIXED)
    assert model.compiled is None and isinstance(model.runner, EagerTarget) and model.plain.runner is model.runner
    assert isinstance(model.drafter.runner, EagerHead) and model.drafter.compiled is None and model.runners == []


def test_eager_and_compiled_runners_share_one_interface():
    target = tiny_llama(seed=2)
    head = random_head(target)
    eager, compiled = (EaModel(target, head, settings=FIXED, compile=c) for c in (False, True))
    for model in (eager, compiled):
        assert isinstance(model.runner, TargetRunner) and isinstance(model.drafter.runner, HeadRunner)
    assert compiled.runner is compiled.compiled is CompiledTarget.of(target) and compiled.plain.runner is compiled.runner
    assert compiled.drafter.runner is compiled.drafter.compiled and compiled.runners == [compiled.runner,
                                                                                          compiled.drafter.runner]


def test_compiled_plain_decoding_equals_hf_generate_and_compiles_once_for_every_bucket():
    target = tiny_llama(seed=1)
    model = EaModel(target, random_head(target), settings=FIXED, compile=True)
    assert model.plain.runner is model.runner is model.compiled is CompiledTarget.of(target)
    for seed, length in ((0, 9), (1, 23)):  # two prompt lengths, one bucket: one graph
        ids = prompt(seed, length)
        assert torch.equal(model.naivegenerate(ids, max_new_tokens=30), hf_greedy(target, ids, 30)), seed
    assert model.compiled.shapes == {(1, False)} and model.compiled.compile_seconds > 0
    compiled_once = model.compiled.compile_seconds
    target.config.max_position_embeddings = 1024  # its rotary embedding has no limit of its own
    for seed, length in ((2, 240), (3, 600)):  # the cache moves to the 512-row bucket mid-generation; a 1,024-row one
        ids = prompt(seed, length)
        assert torch.equal(model.naivegenerate(ids, max_new_tokens=30), hf_greedy(target, ids, 30)), seed
    assert model.compiled.size == 1024 and model.compiled.shapes == {(1, False)}
    assert model.compiled.compile_seconds == compiled_once


@pytest.mark.parametrize("tree, cpp_wrapper", [*((t, "0") for t in sorted(TREES)), ("dynamic", "1")])
def test_compiled_eagle_decoding_equals_hf_generate_across_buckets(tree, cpp_wrapper, monkeypatch):
    """Greedy EAGLE decoding through compiled tree forwards: HF's tokens for every tree kind, with
    long accepted paths (a near-bigram head), a prompt-lookup branch, and a generation that crosses
    from the 256-row into the 512-row bucket; target and head graphs with kernels called from Python
    (the suite's setting, conftest.py) and from C++ (the decoder's default)."""
    monkeypatch.setenv("EAGLE_CPP_WRAPPER", cpp_wrapper)
    target, head = near_bigram_pair(4, coupling=0.3)
    model = EaModel(target, head, settings=TreeSettings(**{**TREES[tree].__dict__, "lookup": 4}), compile=True)
    lengths = []
    for seed, length, new in ((0, 7, 40), (1, 200, 90)):
        ids = prompt(seed, length)
        assert torch.equal(model.eagenerate(ids, max_new_tokens=new), hf_greedy(target, ids, new)), (tree, seed)
        lengths += model.last_stats.accept_lengths
    assert max(lengths) >= 3
    assert {s for s in model.compiled.shapes if s[1]} == {(ANY_ROWS, True)}


def test_one_verify_graph_serves_every_tree_width_with_eagers_logits():
    """Trees of 6, 1 (padded to 2), 11 and 3 nodes through one compiled graph: the eager verify's logits and
    features, and the same committed cache rows (fp32); the widths after the first compile nothing."""
    target, head = near_bigram_pair(5)
    eager = EaModel(target, head, settings=FIXED)
    compiled = EaModel(target, head, settings=FIXED, compile=True)
    ids = prompt(3, 30)
    tree = build_tree(torch.tensor([5, 9, 11, 9, 40, 7]), torch.tensor([-1, 0, 0, 1, 1, 3]))
    graphs = []
    with torch.inference_mode():
        outs = []
        for model in (eager, compiled):
            state, _ = model.prefill(ids)
            verified = model.verify(state, tree)
            state, new = model.commit(state, tree, verified, torch.tensor([0, 1, 3]), 17)  # the head's graphs too
            graphs.append(counters["stats"]["unique_graphs"])
            after = []
            for n in (1, 11, 3):  # chains of n nodes
                after.append(model.verify(state, build_tree(state.root.expand(n).contiguous(),
                                                             torch.arange(-1, n - 1))).logits)
                model.discard(state)
            graphs.append(counters["stats"]["unique_graphs"])
            outs.append((verified.logits, verified.features, new, *after))
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert graphs[3] == graphs[2] and compiled.compiled.shapes == {(ANY_ROWS, True)}


def test_compiled_sampling_draws_what_eager_sampling_draws():
    """Rejection sampling reads the same logits (to ~1e-6 in fp32) and the same random numbers: with one
    seed, compiled and eager decoding sample the same tokens (the χ² tests of test_sampling.py hold)."""
    target, head = near_bigram_pair(6)
    outs = []
    for compile in (False, True):
        model = EaModel(target, head, settings=FIXED, compile=compile)
        torch.manual_seed(0)
        outs.append(model.eagenerate(prompt(4, 12), temperature=0.8, top_p=0.9, max_new_tokens=40))
    assert torch.equal(*outs) and outs[0].shape[1] > 12 + 10


def test_targets_with_sliding_windows_stay_eager():
    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=16)
    mistral = MistralForCausalLM(cfg).eval()
    assert not compilable(mistral)
    model = EaModel(mistral, random_head(mistral), settings=FIXED, compile=True)
    assert model.compiled is None and isinstance(model.runner, EagerTarget) and model.plain.runner is model.runner
    assert model.drafter.compiled is not None  # the head compiles; the target's forwards stay eager
    ids = prompt(5, 20)
    assert torch.equal(model.eagenerate(ids, max_new_tokens=20), hf_greedy(mistral, ids, 20))


def test_auto_budget_times_the_compiled_widths_and_decodes_losslessly(tmp_path, monkeypatch):
    """Compiled, the tuner times verify forwards at COMPILED_SIZES (all through the one dynamic-rows graph),
    stores the pick under a key of its own, and the tuned decoder gives HF's tokens."""
    from eagle.tuning.tuner import COMPILED_SIZES

    monkeypatch.setenv("EAGLE_CACHE", str(tmp_path))
    target, head = near_bigram_pair(7, coupling=0.3)
    model = EaModel.from_modules(target, head, settings=TreeSettings(top_k=4), compile=True, background=False)
    assert sorted(model.tuning.verify_ms) == list(COMPILED_SIZES)
    assert model.settings.total_token in (1, *COMPILED_SIZES)  # 1: plain steps were the fastest
    assert (ANY_ROWS, True) in model.compiled.shapes  # every width timed through one graph
    eager = EaModel.from_modules(target, head, settings=TreeSettings(top_k=4), compile=False, background=False)
    assert len(list((tmp_path / "tree-budgets").glob("*.json"))) == 2  # compiled and eager costs differ
    ids = prompt(6, 15)
    assert torch.equal(model.eagenerate(ids, max_new_tokens=30), hf_greedy(target, ids, 30))
    assert eager.tuning is not None


def test_graphs_called_at_another_thread_count_decode_eagerly_and_say_so_once(caplog):
    """Dynamo keys a graph by torch's thread count: a call at another count would recompile, which the stance of
    compiled calls turns into a RuntimeError. The runners decode it eagerly (same tokens) and warn once."""
    target, threads = tiny_llama(seed=1), torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model, ids = EaModel(target, random_head(target), settings=FIXED, compile=True), prompt(0, 9)
        model.eagenerate(ids, max_new_tokens=12)  # compiles at 2 threads
        shapes, seconds = set(model.compiled.shapes), model.compiled.compile_seconds
        torch.set_num_threads(1)
        with caplog.at_level(logging.WARNING, logger="eagle"):
            for _ in range(2):
                assert torch.equal(model.eagenerate(ids, max_new_tokens=12), hf_greedy(target, ids, 12))
        assert model.compiled.shapes == shapes and model.compiled.compile_seconds == seconds  # nothing compiled
        assert model.compiled.threads == model.drafter.compiled.threads == 2
        assert [r.getMessage() for r in caplog.records].count(
            "torch runs 1 threads, the decoder's graphs were compiled at 2: decoding eagerly (slower) until the "
            "count is set back (torch.set_num_threads(2)) or the model is loaded again") == 1
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("kind", ["eagle2", "eagle3"])
def test_compiled_decoding_through_the_gemm_template_equals_hf_generate(kind, monkeypatch):
    """Graphs whose matmuls take inductor's C++ GEMM template (fp32 weights the GEMV does not read: every matmul
    on a CPU without AVX512, the default `EAGLE_MATMULS=template`) compile and decode HF's greedy tokens. The
    head's scored graph once failed to compile there (the template fused the residual add and the scorer's row
    gather into one epilogue of other ranks: inductor's "wrong ndim"), and decoding fell back to eager."""
    monkeypatch.setenv("EAGLE_MATMULS", "template")
    target = tiny_llama(seed=3)
    head = random_eagle3_head(target) if kind == "eagle3" else random_head(target, seed=4)
    model = EaModel(target, head, settings=TreeSettings(total_token=4, depth=2, top_k=2, lookup=0), compile=True)
    ids = prompt(0, 12)
    assert torch.equal(model.eagenerate(ids, max_new_tokens=12), hf_greedy(target, ids, 12))
    assert model.drafter.compiled.shapes and model.compiled.shapes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_padded_mask_opens_the_allowed_pattern_and_each_padded_rows_own_row(dtype):
    """2 real rows after 3 cached ones, padded to 4 rows over an 8-row bucket."""
    allowed = torch.tensor([[1, 0, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)  # [m=2, p+m=5]
    mask = padded_mask(allowed, 4, 8, dtype)
    assert mask.shape == (1, 1, 4, 8) and mask.dtype == dtype
    opened = [[0, 2, 3], [0, 1, 2, 3, 4], [5], [6]]  # padded rows 2, 3 see cache rows p+2, p+3
    for row, columns in enumerate(opened):
        expected = torch.full((8,), torch.finfo(dtype).min, dtype=dtype)
        expected[columns] = 0
        assert torch.equal(mask[0, 0, row], expected), row


def test_padded_mask_of_a_pattern_after_open_rows_equals_the_whole_pattern():
    """A step's rows see every committed row: `past` open columns, then the new rows' own pattern."""
    visible = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # [m=3, v=3]
    whole = torch.cat([torch.ones(3, 5, dtype=torch.bool), visible], dim=1)  # [m, p+m]: 5 committed rows
    for rows in (3, 4, 8):
        assert torch.equal(padded_mask(visible, rows, 16, torch.float32, past=5), padded_mask(whole, rows, 16, torch.float32))
