"""EaModel end to end: greedy output equals HF greedy decoding; loading; stop conditions."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
import torch
from transformers import LlamaConfig

from eagle.heads.checkpoint import load_head, save_head, write_draft_vocab
from eagle.heads.eagle2 import DraftHead
from eagle.decoding.tree_drafter import DraftCache
from eagle.model import EaModel
from eagle.decoding.settings import TreeSettings
from eagle.decoding.tree import static_tree
from eagle.decoding.verify import SamplingParams
from tests.tiny import (
    FIXED,
    TREES,
    embedded_target_or_skip,
    hf_greedy,
    near_bigram_pair,
    prompt,
    random_head,
    tiny_llama,
)


@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("seed", range(8))
def test_greedy_equals_hf_generate_random_head(seed, tree):
    target = tiny_llama(seed)
    model = EaModel(target, random_head(target, seed + 10, layers=1 + seed % 2), settings=TREES[tree])  # odd seeds: 2 layers
    for p in range(2):
        ids = prompt(10 * seed + p, 3 + 4 * p)
        ref = hf_greedy(target, ids, 24)
        assert torch.equal(model.eagenerate(ids, max_new_tokens=24), ref)


@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("seed", range(8))
def test_greedy_equals_hf_generate_with_high_acceptance(seed, tree):
    target, head = near_bigram_pair(seed)
    model = EaModel(target, head, settings=TREES[tree])
    accepted = []
    for p in range(2):
        ids = prompt(10 * seed + p, 4 + 3 * p)
        ref = hf_greedy(target, ids, 40)
        assert torch.equal(model.eagenerate(ids, max_new_tokens=40), ref)
        accepted += model.last_stats.accept_lengths
    assert max(accepted) >= 3  # long paths are really exercised
    assert sum(accepted) / len(accepted) > 1.5


@pytest.mark.parametrize("sizes", [TreeSettings(total_token=200, depth=3, top_k=50), TreeSettings(total_token=2, depth=1, top_k=1)])
def test_extreme_tree_sizes(sizes):
    target, head = near_bigram_pair(6, vocab_size=16)
    model = EaModel(target, head, settings=sizes)  # top_k above the vocabulary, a pool smaller than total_token
    ids = prompt(3, 4, vocab=16)
    assert torch.equal(model.eagenerate(ids, max_new_tokens=20), hf_greedy(target, ids, 20))


def test_bfloat16_runs():
    target, head = near_bigram_pair(1)
    model = EaModel(target.to(torch.bfloat16), head.to(torch.bfloat16), settings=FIXED)
    model.eos_ids = set()
    out = model.eagenerate(prompt(0, 5), max_new_tokens=16)
    assert out.shape == (1, 21)
    out = model.eagenerate(prompt(0, 5), temperature=0.8, top_p=0.9, max_new_tokens=16)
    assert out.shape == (1, 21)


def causal_draft_outputs(model: EaModel, state, tree) -> dict[int, torch.Tensor]:
    """Head output of every node, computed one row at a time along its root-to-node path."""
    outputs = {0: state.draft_hidden[0]}
    with torch.no_grad():
        for node in range(1, tree.size):
            path = tree.ancestors[node].nonzero().flatten().tolist()
            past, feature = state.head_past, state.draft_hidden
            for n in path[1:]:
                position = torch.tensor([past[0].shape[2]])  # the next row of a causal sequence
                feature, _, past = model.drafter.encode(feature, tree.tokens[n : n + 1], position, None, past)
            outputs[node] = feature[0]
    return outputs


@pytest.mark.parametrize("seed", range(3))
def test_drafted_nodes_follow_causal_head_passes(seed):
    """Tree drafting (tree mask over the head's cache) matches a causal pass per path."""
    target = tiny_llama(seed)
    model = EaModel(target, random_head(target, seed), settings=TreeSettings(total_token=20, depth=4, top_k=4))
    state, _ = model.prefill(prompt(seed, 7), SamplingParams())
    for shape in (None, static_tree([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0, 0]])):
        model.static = shape
        tree = model.draft(state)
        outputs = causal_draft_outputs(model, state, tree)
        for node in range(1, tree.size):
            parent = int(tree.parents[node])
            logp = model.drafter.vocab.logp(outputs[parent][None])[0]
            if shape is None:  # dynamic: a top-k child of its parent
                assert int(tree.tokens[node]) in logp.topk(4).indices.tolist()
            else:  # static: exactly the rank its path names
                rank = shape.paths[node][-1]
                assert int(tree.tokens[node]) == int(logp.topk(rank + 1).indices[rank])


@pytest.mark.parametrize("layers", [1, 2])
def test_draft_cache_feed_equals_causal_head_passes(layers):
    """Rows fed under the drafting tree mask equal a causal head pass along each node's path."""
    target = tiny_llama(3)
    head = random_head(target, 3, layers)
    with torch.no_grad():  # sharper attention, so masks and positions visibly matter
        for layer in head.layers:
            layer.self_attn.q_proj.weight.mul_(8)
            layer.self_attn.k_proj.weight.mul_(8)
    model = EaModel(target, head, settings=FIXED)
    state, _ = model.prefill(prompt(1, 6), SamplingParams())
    drafts = DraftCache(state)
    with torch.no_grad():
        out1, logp1, rows1 = drafts.feed(model.drafter, torch.tensor([10, 11]), state.draft_hidden.expand(2, -1),
                                         [-1, -1], depth=1)
        out2, logp2, rows2 = drafts.feed(model.drafter, torch.tensor([12, 13, 14]), out1[[0, 1, 0]],
                                         [rows1[i] for i in (0, 1, 0)], depth=2)
        out3, logp3, _ = drafts.feed(model.drafter, torch.tensor([15]), out2[[2]], [rows2[2]], depth=3)
        for out, logp in [(out1, logp1), (out2, logp2), (out3, logp3)]:  # every fed row's draft log-probs
            torch.testing.assert_close(logp, model.drafter.vocab.logp(out))
        for path, got in [([10], out1[0]), ([11], out1[1]), ([10, 12], out2[0]), ([11, 13], out2[1]),
                          ([10, 14], out2[2]), ([10, 14, 15], out3[0])]:
            past, feature = state.head_past, state.draft_hidden
            for token in path:
                position = torch.tensor([past[0].shape[2]])  # the next row of a causal sequence
                feature, _, past = model.drafter.encode(feature, torch.tensor([token]), position, None, past)
            assert torch.allclose(got, feature[0], atol=1e-5), path


@pytest.mark.parametrize("tree", ["dynamic", "static"])
@pytest.mark.parametrize("temperature", [0.0, 0.3])
def test_head_cache_holds_target_features_of_committed_tokens(tree, temperature):
    """After several steps the head's cache equals a fresh head pass over the committed tokens
    with the target's own features: accepted drafts are re-encoded with verified features."""
    target, head = near_bigram_pair(7)
    h = target.config.hidden_size
    with torch.no_grad():  # make the head depend on the features, keeping its drafts good
        head.fc.weight[:, h:] = 3e-4 * torch.randn(h, h, generator=torch.Generator().manual_seed(0))
    model = EaModel(target, head, settings=replace(FIXED, tree=tree))
    params = SamplingParams(temperature)
    torch.manual_seed(0)
    state, _ = model.prefill(prompt(5, 6), params)
    lengths = []
    with torch.no_grad():
        for _ in range(8):
            state, new = model.step(state, model.draft(state), params)
            lengths.append(new.numel())
        committed = state.committed
        assert state.target_cache.get_seq_length() == committed
        features = target(state.ids[:, :-1], output_hidden_states=True).hidden_states[-1][0]  # [L-1, H]
        hidden, logp, past = model.drafter.encode(features, state.ids[0, 1:], torch.arange(committed), None, None, 1)
    assert max(lengths) > (2 if temperature == 0 else 1)  # multi-row re-encodes happened
    assert torch.allclose(past[0], state.head_past[0], atol=1e-5)
    assert torch.allclose(past[1], state.head_past[1], atol=1e-5)
    assert torch.allclose(hidden[-1:], state.draft_hidden, atol=1e-5)
    assert torch.allclose(logp, state.draft_logp, atol=1e-5)  # the next draft's log-probs, from the commit's call


def test_greedy_equals_naivegenerate_and_log_semantics():
    target, head = near_bigram_pair(5)
    model = EaModel(target, head, settings=FIXED)
    model.eos_ids = set()
    ids = prompt(1, 6)
    out, new, steps = model.eagenerate(ids, max_new_tokens=30, log=True)
    stats = model.last_stats
    assert new == 30 == out.shape[1] - ids.shape[1] == stats.new_tokens
    assert steps == stats.steps == len(stats.accept_lengths) and steps < 29
    assert 1 + sum(stats.accept_lengths) >= new  # the prefill token plus every step
    assert stats.acceptance_by_depth()[0] > 0.5
    naive, new_n, steps_n = model.naivegenerate(ids, max_new_tokens=30, log=True)
    assert torch.equal(naive, out) and new_n == 30 and steps_n == 29


def test_a_prompt_forward_computes_only_its_last_rows_logits():
    """Both prefills (speculative and plain) ask the target for the last row's logits only: its lm_head
    multiplies one row, not every row of the prompt, and the decoding stays HF's."""
    target, head = near_bigram_pair(5)
    model = EaModel(target, head, settings=FIXED)
    rows = []
    hook = target.lm_head.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[-2]))
    ids = prompt(1, 9)
    with torch.inference_mode():
        model.prefill(ids)
        model.plain.prefill(ids)
    hook.remove()
    assert rows == [1, 1, 1]  # the speculative prefill, its head's draft of the next token (this head scores
    # with the target's lm_head) and the plain prefill: one row each
    assert torch.equal(model.eagenerate(ids, max_new_tokens=12), hf_greedy(target, ids, 12))


def test_streaming_yields_the_same_tokens():
    target, head = near_bigram_pair(2)
    model = EaModel(target, head, settings=FIXED)
    ids = prompt(4, 5)
    chunks = list(model.ea_generate(ids, max_new_tokens=25))
    assert any(c.numel() > 1 for c in chunks)
    assert torch.equal(torch.cat([ids[0], *chunks]), model.eagenerate(ids, max_new_tokens=25)[0])


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_generate_streams_and_the_eagle_names_are_its_aliases(temperature):
    """generate(stream=...) and its four EAGLE-named forms give the same tokens and the same stats
    (sampling: from the same seed)."""
    target, head = near_bigram_pair(2)
    model = EaModel(target, head, settings=FIXED)
    ids = prompt(4, 5)

    def run(fn, *args, **kwargs):
        torch.manual_seed(0)
        out = fn(ids, temperature, 0.9 if temperature else 0.0, *args, max_new_tokens=25, **kwargs)
        out = torch.cat([ids, *(t[None] for t in out)], dim=1) if not isinstance(out, torch.Tensor) else out
        return out[0].tolist(), model.last_stats.method, model.last_stats.steps, model.last_stats.accept_lengths

    for method, alias, stream_alias in (("eagle", model.eagenerate, model.ea_generate),
                                        ("naive", model.naivegenerate, model.naive_generate)):
        whole = run(model.generate, method=method)
        assert whole[1] == method and len(whole[0]) > 5 + 10
        assert run(alias) == whole and run(stream_alias) == whole
        assert run(model.generate, stream=True, method=method) == whole
        chunks = model.generate(ids, max_new_tokens=25, stream=True, method=method)
        assert not isinstance(chunks, torch.Tensor) and all(c.dim() == 1 for c in chunks)
    assert run(model.generate) == run(model.eagenerate)  # method="eagle" is the default
    if temperature == 0.0:
        assert run(model.generate)[0] == run(model.generate, method="naive")[0]
        out, new, steps = model.generate(ids, max_new_tokens=25, log=True)
        assert new == model.last_stats.new_tokens and steps == model.last_stats.steps
    with pytest.raises(ValueError, match="method="):
        model.generate(ids, method="beam")
    with pytest.raises(ValueError, match="last_stats"):
        model.generate(ids, stream=True, log=True)


@pytest.mark.parametrize("method", ["eagenerate", "naivegenerate"])
def test_max_new_tokens_and_max_length_are_never_exceeded(method):
    target, head = near_bigram_pair(3)
    model = EaModel(target, head, settings=FIXED)
    model.eos_ids = set()
    ids = prompt(9, 6)
    full = getattr(model, method)(ids, max_new_tokens=40)
    assert full.shape[1] == 46
    for limit in range(0, 14):  # cuts fall inside accepted paths
        out = getattr(model, method)(ids, max_new_tokens=limit)
        assert torch.equal(out, full[:, : 6 + limit])
        out = getattr(model, method)(ids, max_new_tokens=100, max_length=6 + limit)
        assert torch.equal(out, full[:, : 6 + limit])
    assert torch.equal(getattr(model, method)(ids, max_length=4), ids)  # prompt already too long


@pytest.mark.parametrize("method", ["eagenerate", "naivegenerate"])
def test_eos_stops_generation(method):
    target, head = near_bigram_pair(3)
    model = EaModel(target, head, settings=FIXED)
    model.eos_ids = set()
    ids = prompt(9, 6)
    full = getattr(model, method)(ids, max_new_tokens=40)[0, 6:].tolist()
    eos = full[7]
    first = full.index(eos)
    model.eos_ids = {eos}
    out = getattr(model, method)(ids, max_new_tokens=40)[0, 6:].tolist()
    assert out == full[: first + 1]


def test_eos_ids_come_from_the_generation_config():
    target = tiny_llama(0)
    assert EaModel(target, random_head(target), settings=FIXED).eos_ids == {2}


def write_eagle_layout(directory, head: DraftHead, target) -> None:
    """A head as the EAGLE authors publish it: LlamaConfig json, pytorch_model.bin, EAGLE keys."""
    directory.mkdir()
    c = head.config
    cfg = LlamaConfig(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                      num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                      vocab_size=c.vocab_size, rms_norm_eps=c.rms_norm_eps, num_hidden_layers=1,
                      rope_theta=c.rope_theta, max_position_embeddings=c.max_position_embeddings)
    raw = cfg.to_dict()
    raw["bias"] = True
    (directory / "config.json").write_text(json.dumps(raw))
    state = dict(head.state_dict())
    state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
    torch.save(state, directory / "pytorch_model.bin")


def test_a_two_layer_head_round_trips_and_stays_lossless(tmp_path):
    """A deeper head saves EAGLE's key names for its second layer (with its input norm) and decodes losslessly."""
    target = tiny_llama(5)
    head = random_head(target, 5, layers=2)
    save_head(tmp_path / "head", head, dtype=torch.float32)
    loaded = load_head(tmp_path / "head")
    assert loaded.config.num_hidden_layers == 2 and "layers.1.input_layernorm.weight" in loaded.state_dict()
    assert "layers.0.input_layernorm.weight" not in loaded.state_dict()  # the first layer reads fc's output as is
    for key, value in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    model = EaModel(target, loaded, settings=TreeSettings(total_token=10, depth=4, top_k=3))
    ids = prompt(4, 6)
    assert torch.equal(model.eagenerate(ids, max_new_tokens=20), hf_greedy(target, ids, 20))
    past = model.prefill(ids, SamplingParams())[0].head_past
    assert past[0].shape[1] == 2 * head.config.num_key_value_heads  # both layers' KV heads, side by side


@pytest.mark.parametrize("layout", ["ours", "eagle"])
def test_from_pretrained_both_head_layouts(tmp_path, layout):
    target, head = near_bigram_pair(4)
    target.save_pretrained(tmp_path / "target")
    if layout == "ours":
        save_head(tmp_path / "head", head, dtype=torch.float32)
    else:
        write_eagle_layout(tmp_path / "head", head, target)
    model = EaModel.from_pretrained(str(tmp_path / "target"), str(tmp_path / "head"), torch_dtype=torch.float32,
                                    total_token=10, depth=4, top_k=3)
    for key, value in head.state_dict().items():
        assert torch.equal(model.head.state_dict()[key], value), key
    assert model.head.config.fc_bias
    ids = prompt(2, 5)
    assert torch.equal(model.eagenerate(ids, max_new_tokens=20), hf_greedy(target, ids, 20))
    assert model.tokenizer is None and model.eos_ids == {2}


@pytest.mark.parametrize("bf16_arithmetic, computes_in", [(False, torch.float32), (True, torch.bfloat16)])
def test_from_pretrained_computes_bf16_in_fp32_where_the_cpu_has_no_bf16_arithmetic(
        tmp_path, monkeypatch, bf16_arithmetic, computes_in):
    target, head = near_bigram_pair(4)
    target.save_pretrained(tmp_path / "target")
    save_head(tmp_path / "head", head, dtype=torch.bfloat16)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16_arithmetic)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    for asked in (torch.bfloat16, "auto"):
        model = EaModel.from_pretrained(str(tmp_path / "target"), str(tmp_path / "head"), torch_dtype=asked,
                                        compile=False, total_token=4, depth=2, top_k=2)
        assert model.target.dtype == computes_in and model.head.fc.weight.dtype == computes_in, asked


def test_static_and_dynamic_tree_shapes():
    target = tiny_llama(0)
    model = EaModel(target, random_head(target), settings=TreeSettings(total_token=15, depth=4, top_k=3))
    state, _ = model.prefill(prompt(0, 5), SamplingParams())
    tree = model.draft(state)
    assert tree.size == 15 and int(tree.depths.max()) <= 4
    assert all(0 <= int(tree.parents[i]) < i for i in range(1, tree.size))
    model.static = static_tree([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
    tree = model.draft(state)
    assert tree.size == 7
    # static nodes are the top-k ranks of their parent's draft: [0] and [1] differ, [0,0] != [0,1]
    assert tree.tokens[1] != tree.tokens[2] and tree.tokens[3] != tree.tokens[4]


def _paths(tokens: torch.Tensor, parents: torch.Tensor) -> set[tuple[int, ...]]:
    """Every node of a tree as its root-to-node token path."""
    paths: list[tuple[int, ...]] = []
    for i, p in enumerate(parents.tolist()):
        paths.append((*(paths[p] if p >= 0 else ()), int(tokens[i])))
    return set(paths)


@pytest.mark.parametrize("seed", range(3))
def test_a_pool_of_total_token_minus_one_children_drafts_the_same_tree(seed):
    """The dynamic tree of n nodes from a pool min(top_k, n - 1) wide (draft_width) is the one the full
    top_k pool gives: the n - 1 best candidates never rank below n - 1 among their siblings or depth."""
    from eagle.decoding.tree_drafter import draft_width
    from eagle.decoding.tree import reindex_parents, select_nodes

    target = tiny_llama(seed)
    model = EaModel(target, random_head(target, seed), settings=TreeSettings(total_token=8, depth=4, top_k=8))
    state, _ = model.prefill(prompt(seed, 9), SamplingParams())
    for n in (2, 3, 5, 9):
        for d in (1, 2, 4):
            tokens, scores, parents = model.draft_candidates(state, d)  # the full pool, 8 children a node
            kept = select_nodes(scores, parents, n - 1)
            wide = _paths(torch.cat([state.root, tokens[kept]]), reindex_parents(kept, parents))
            drafted = model.drafter.dynamic(state, n, d, 8)
            assert _paths(*drafted) == wide, (n, d)
            if d == 1:  # the root's children, in rank order: the pool's order
                assert drafted[0].tolist() == torch.cat([state.root, tokens[kept]]).tolist()
                assert drafted[1].tolist() == reindex_parents(kept, parents).tolist()
            assert draft_width(n, 8) == min(8, n - 1)


@pytest.mark.slow
def test_embedded_target_greedy_equality_random_head():
    folder = embedded_target_or_skip()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = EaModel(target, random_head(target), tokenizer, settings=FIXED)
    assert 2 in model.eos_ids  # <|im_end|>
    questions = ["What is the capital of France?", "Write a haiku about the sea.", "Explain recursion briefly."]
    for q in questions:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                            return_tensors="pt")["input_ids"]
        start = time.perf_counter()
        ref = target.generate(ids, do_sample=False, max_new_tokens=32, attention_mask=torch.ones_like(ids))
        hf_seconds = time.perf_counter() - start
        out = model.eagenerate(ids, max_new_tokens=32)
        stats = model.last_stats
        print(f"\n{q!r}: tau {stats.tau:.2f}, {stats.tokens_per_second:.1f} tok/s "
              f"(HF generate {(ref.shape[1] - ids.shape[1]) / hf_seconds:.1f} tok/s)")
        assert torch.equal(out, ref)


# ---- draft vocabulary ------------------------------------------------------------------


def test_an_eagle2_draft_vocabulary_round_trips_beside_the_weights(tmp_path):
    """EAGLE's, vLLM's and SGLang's EAGLE-1/2 models have no d2t/t2d: the weights stay EAGLE's
    and the vocabulary, most frequent first, is draft_vocab.json."""
    import json

    from safetensors.torch import load_file

    target, head = near_bigram_pair(2)
    head.draft_ids = torch.tensor([7, 3, 100, 5])
    save_head(tmp_path / "head", head, dtype=torch.float32)
    assert set(load_file(str(tmp_path / "head" / "model.safetensors"))) == set(head.state_dict())
    assert json.loads((tmp_path / "head" / "draft_vocab.json").read_text()) == {"target_ids": [7, 3, 100, 5]}

    assert load_head(tmp_path / "head").draft_ids.tolist() == [7, 3, 100, 5]
    write_draft_vocab(tmp_path / "head", torch.tensor([1, 2]))
    assert load_head(tmp_path / "head").draft_ids.tolist() == [1, 2]
    with pytest.raises(ValueError, match="distinct target ids"):
        write_draft_vocab(tmp_path / "head", torch.tensor([1, 1]))


@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("seed", range(3))
def test_greedy_equality_with_a_reduced_draft_vocabulary(seed, tree):
    target, head = near_bigram_pair(seed)
    ids = prompt(seed, 6)
    ref = hf_greedy(target, ids, 40)
    freq = torch.bincount(ref[0], minlength=128)  # most frequent output tokens first
    head.draft_ids = torch.sort(-freq, stable=True).indices[:48]
    model = EaModel(target, head, settings=replace(TREES[tree], draft_vocab=32))
    assert torch.equal(model.eagenerate(ids, max_new_tokens=40), ref)
    drafted = set(model.drafter.vocab.ids.tolist())
    state, _ = model.prefill(ids, SamplingParams())
    assert set(model.draft(state).tokens[1:].tolist()) <= drafted  # drafts come from the subset
    assert model.last_stats.tau > 1.2


def test_draft_vocab_beyond_the_stored_vocabulary_adds_the_targets_other_tokens():
    target, head = near_bigram_pair(0)
    ids = prompt(0, 6)
    ref = hf_greedy(target, ids, 30)
    head.draft_ids = torch.tensor([5, 3, 9])
    model = EaModel(target, head, settings=replace(FIXED, draft_vocab=40))
    assert model.drafter.vocab.ids[:3].tolist() == [5, 3, 9] and len(set(model.drafter.vocab.ids.tolist())) == 40
    assert torch.equal(model.eagenerate(ids, max_new_tokens=30), ref)
    assert EaModel(target, head, settings=replace(FIXED, draft_vocab=128)).drafter.vocab.ids is None  # the whole vocabulary


def test_draft_vocab_without_a_stored_vocabulary_is_a_clear_error():
    target, head = near_bigram_pair(0)
    with pytest.raises(ValueError, match="stored draft vocabulary"):
        EaModel(target, head, settings=replace(FIXED, draft_vocab=16))


# ---- total_token="auto" ----------------------------------------------------------------


def test_auto_budget_predicts_the_real_accept_lengths_and_stays_lossless(monkeypatch):
    """The tuner's accept length for every (n, d) equals verifying that tree for real, at every position of its
    greedy text; the plain step is timed in the same rounds as the verify widths."""
    from eagle.tuning import tuner as autotune
    from eagle.tuning.tuner import calibration_prompts, tune_tree
    from eagle.decoding.tree import build_tree, reindex_parents, select_nodes
    from eagle.decoding.verify import verify_greedy

    target, head = near_bigram_pair(3, coupling=0.3)
    model = EaModel(target, head, settings=TreeSettings(total_token=8, depth=3, top_k=4))
    sizes, depths, steps = (4, 8, 16), (2, 4), 6
    prompts = calibration_prompts(model)[:2]
    timed, fastest = [], autotune.fastest_ms
    monkeypatch.setattr(autotune, "fastest_ms", lambda fns, rounds, *pause: timed.append(set(fns)) or fastest(fns, rounds, *pause))
    with torch.inference_mode():
        budget = tune_tree(model, prompts, sizes=sizes, depths=depths, positions_per_prompt=steps, repeats=1)
    assert {*sizes, autotune.PLAIN} in timed
    with torch.inference_mode():
        real = {key: [] for key in budget.accepted}
        for ids in prompts:  # replay the calibration trajectory, verifying each (n, d) tree with the target
            state, _ = model.prefill(ids, SamplingParams())
            for _ in range(steps):
                root = state.root
                for n, d in real:
                    tokens, scores, parents = model.draft_candidates(state, d)
                    kept = select_nodes(scores, parents, n - 1)
                    tree = build_tree(torch.cat([root, tokens[kept]]), reindex_parents(kept, parents))
                    logits = model.verify(state, tree).logits
                    model.discard(state)
                    real[(n, d)].append(verify_greedy(tree, logits)[0].numel())
                state, _ = model.step(state, build_tree(root, torch.tensor([-1])), SamplingParams())  # one token
    assert real == budget.accepted
    assert {(r["total_token"], r["depth"]) for r in budget.grid if r["total_token"] > 1 and not r["lookup"]} == set(real)
    plain = [r for r in budget.grid if r["total_token"] == 1 and not r["lookup"]]  # plain decoding is a candidate too
    assert len(plain) == 1 and plain[0]["tau"] == 1.0 and plain[0]["parts_ms"] == budget.plain_ms > 0
    assert plain[0]["timed"] and plain[0]["ms_per_step"] > 0  # and then as real plain decoding steps
    assert max(max(v) for v in real.values()) >= 3  # long paths really occur
    auto = EaModel.from_modules(target, head, settings=TreeSettings(total_token="auto", top_k=4), background=False)
    assert auto.tuning is not None
    assert (auto.settings.total_token, auto.settings.depth) == (auto.tuning.total_token, auto.tuning.depth)
    with pytest.raises(ValueError, match="from_pretrained or EaModel.from_modules"):
        EaModel(target, head, settings=TreeSettings(total_token="auto"))  # the constructor never times
    ids = prompt(1, 5)
    assert torch.equal(auto.eagenerate(ids, max_new_tokens=30), hf_greedy(target, ids, 30))


def test_the_tuner_predicts_what_a_lookup_chain_adds_on_every_step():
    """For every (n, d) and chain length L of the grid, a tree with the chain merged in accepts what
    the tuner predicts from the greedy text alone: max(the tree's own length, 1 + the chain's
    matching prefix), at every calibration position whose chain ends inside the decoded text."""
    from eagle.decoding.prompt_lookup import lookup_chain, merge_chain
    from eagle.decoding.tree import build_tree, reindex_parents, select_nodes
    from eagle.decoding.verify import verify_greedy
    from eagle.tuning.tuner import calibration_prompts, chain_lengths, tune_tree

    target, head = near_bigram_pair(3, coupling=0.3)
    model = EaModel(target, head, settings=TreeSettings(total_token=8, depth=3, top_k=4))
    sizes, depths, steps = (4, 8), (2,), 12
    prompts = calibration_prompts(model)[:2]
    with torch.inference_mode():
        budget = tune_tree(model, prompts, sizes=sizes, depths=depths, positions_per_prompt=steps, repeats=1)
        step, checked = 0, 0
        for ids in prompts:
            state, _ = model.prefill(ids, SamplingParams())
            ends = []
            for _ in range(steps):
                for n in sizes:
                    tokens, scores, parents = model.draft_candidates(state, 2)
                    kept = select_nodes(scores, parents, n - 1)
                    for lookup in chain_lengths(n, sizes)[1:] + [2]:
                        chain = lookup_chain(state.ids[0], lookup)
                        tree = build_tree(*merge_chain(torch.cat([state.root, tokens[kept]]),
                                                       reindex_parents(kept, parents), chain))
                        got = verify_greedy(tree, model.verify(state, tree).logits)[0].numel()
                        model.discard(state)
                        want = max(budget.accepted[(n, 2)][step], 1 + min(budget.copied[step], lookup))
                        ends.append((step, state.ids.shape[1] + lookup, got, want))
                state, _ = model.step(state, build_tree(state.root, torch.tensor([-1])), SamplingParams())
                step += 1
            for _, end, got, want in ends:
                assert got >= want
                if end <= state.ids.shape[1]:  # the tuner saw the tokens this chain could copy
                    assert got == want
                    checked += 1
    assert checked > 30 and max(budget.copied) >= 2  # chains really copy here
    rows = {(r["total_token"], r["lookup"]) for r in budget.grid}
    assert {(4, 4), (4, 3), (8, 0), (1, 3), (1, 6), (1, 0)} <= rows and (8, 1) not in rows  # n + L fits; lookup alone too


def test_a_one_node_tree_decodes_by_plain_steps_and_the_tuner_can_pick_it(monkeypatch):
    """total_token=1 (dynamic, no lookup) drafts nothing: eagenerate runs plain steps, same tokens;
    where plain steps are the fastest row of the tuner's grid, "auto" picks them."""
    from eagle.tuning import tuner as autotune

    target, head = near_bigram_pair(4)
    model = EaModel(target, head, settings=TreeSettings(total_token=1, depth=2, top_k=4, lookup=0))
    assert model.plain_decoding and not EaModel(target, head, settings=replace(FIXED, lookup=3)).plain_decoding
    monkeypatch.setattr(model, "draft", lambda state: pytest.fail("a one-node tree drafted"))
    ids = prompt(2, 6)
    out, new, steps = model.eagenerate(ids, max_new_tokens=20, log=True)
    assert torch.equal(out, hf_greedy(target, ids, 20)) and new == 20 and model.last_stats.method == "eagle"
    grid = [{"total_token": 8, "depth": 3, "tau": 1.5, "ms_per_step": 30.0, "tokens_per_s": 50.0},
            {"total_token": 1, "depth": 3, "tau": 1.0, "ms_per_step": 19.8, "tokens_per_s": 50.5}]
    assert autotune.choose(grid)["total_token"] == 1
    grid[0]["tau"], grid[0]["tokens_per_s"] = 2.0, 66.7
    assert autotune.choose(grid)["total_token"] == 8


def test_prompt_lookup_alone_drafts_nothing_and_stays_lossless(monkeypatch):
    """total_token=1 with a chain (a tuner row): the head drafts no tree, the chain alone is verified,
    and the output is plain greedy decoding's."""
    target, head = near_bigram_pair(4)
    model = EaModel(target, head, settings=TreeSettings(total_token=1, depth=2, top_k=4, lookup=4))
    assert not model.plain_decoding
    monkeypatch.setattr(model.drafter, "candidates", lambda *a: pytest.fail("a one-node tree drafted"))
    ids = prompt(2, 6)
    out, new, steps = model.eagenerate(ids, max_new_tokens=30, log=True)
    assert torch.equal(out, hf_greedy(target, ids, 30)) and steps < 30  # the chain copied tokens


def test_bad_total_token_is_a_clear_error():
    target, head = near_bigram_pair(0)
    with pytest.raises(ValueError, match="total_token"):
        EaModel(target, head, settings=TreeSettings(total_token="big"))


def test_head_for_another_target_is_a_one_line_error():
    target, head = near_bigram_pair(0)
    other = tiny_llama(1, vocab_size=96)
    with pytest.raises(ValueError, match=r"trained for .*vocabulary 128.*vocabulary 96.*python -m train"):
        EaModel(other, head, settings=FIXED)


def test_a_tuned_budget_is_reused_for_the_same_head_target_and_machine(tmp_path, monkeypatch):
    """total_token="auto" times the machine once; the next load with the same key reuses the pick
    (eagle/tuning/budget_cache.py); another head, or reuse=False, measures again."""
    import eagle.model
    from eagle.common.permissions import current_umask

    monkeypatch.setenv("EAGLE_CACHE", str(tmp_path))
    calls = []
    real = eagle.model.tune_tree

    def counted(model, prompts=None, sizes=None, **options):
        calls.append(1)
        return real(model, prompts, sizes, positions_per_prompt=2, repeats=1, **options)

    monkeypatch.setattr(eagle.model, "tune_tree", counted)
    target, head = near_bigram_pair(2)
    auto = TreeSettings(top_k=4)
    first = EaModel.from_modules(target, head, settings=auto, background=False)
    again = EaModel.from_modules(target, head, settings=auto)  # a cached pick: no background work
    assert len(calls) == 1 and again.settings == first.settings and again.tuning.grid == first.tuning.grid
    (budget,) = (tmp_path / "tree-budgets").glob("*.json")
    assert budget.stat().st_mode & 0o777 == 0o666 & ~current_umask()  # not mkstemp's 0600: a shared cache reads it
    assert again.warmup is None
    EaModel.from_modules(target, random_head(target, 9), settings=auto, background=False)
    again.tune(reuse=False)
    assert len(calls) == 3


def test_a_budget_is_keyed_by_how_the_graphs_call_their_kernels(monkeypatch):
    """The C++ wrapper and our attention kernel make a verify cheaper than a plain step by more (docs/speed.md): a
    pick timed with one is not reused with the other. Eager decoders have no graphs to tell apart."""
    from eagle.tuning.budget_cache import budget_key

    target, head = near_bigram_pair(2)
    compiled = EaModel(target, head, settings=FIXED, compile=True)  # nothing compiles until a forward
    keys = {}
    for wrapper in ("1", "0"):
        monkeypatch.setenv("EAGLE_CPP_WRAPPER", wrapper)
        keys[wrapper] = budget_key(compiled, [8], [2])
    assert keys["1"]["cpp_wrapper"] is True and keys["0"]["cpp_wrapper"] is False
    for choice in ("auto", "0"):
        monkeypatch.setenv("EAGLE_ATTENTION", choice)
        keys[choice] = budget_key(compiled, [8], [2])["attention"]
    assert keys["auto"].startswith("attn-") and keys["0"] == "sdpa"  # known before the kernel is built
    eager = budget_key(EaModel(target, head, settings=FIXED), [8], [2])
    assert eager["cpp_wrapper"] is None and eager["attention"] is None


def test_a_pick_timed_beside_other_work_is_used_but_not_cached(tmp_path, monkeypatch, caplog):
    """A pick timed while other processes took the machine would price every later process's forwards by
    their load (eagle/tuning/machine_load.py): it decodes this process, and the next load times again."""
    from eagle.tuning import machine_load

    monkeypatch.setenv("EAGLE_CACHE", str(tmp_path))
    monkeypatch.setattr(machine_load, "BUSY", -1.0)  # any share of others' work counts as busy
    target, head = near_bigram_pair(2)
    with caplog.at_level("WARNING", logger="eagle"):
        model = EaModel.from_modules(target, head, settings=TreeSettings(top_k=4), background=False)
    assert model.tuning is not None and model.settings.total_token == model.tuning.total_token
    assert not list(tmp_path.glob("tree-budgets/*.json"))
    assert "not cached, and timed again at the next load" in caplog.text
