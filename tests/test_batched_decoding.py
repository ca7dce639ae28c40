"""Our batched reply engine (data_prep/batched_decoding.py) and its slot attention (data_prep/slot_attention.py):
the C++ kernel against torch, and the engine's replies against the target's own greedy decoding of each
prompt alone, whatever the batch, the queue and the slots reused across a conversation's turns."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM, MistralConfig, MistralForCausalLM

from data_prep import slot_attention
from data_prep.batched_decoding import BatchedDecoding
from data_prep.conversations import Conversation
from data_prep.data_config import RegenConfig
from data_prep.regenerate import ReplyGenerator
from data_prep.reply_requests import Request
from eagle.targets.tokenizer import load_tokenizer
from tests.tiny import hf_greedy, prompt, tiny_llama

GREEDY = RegenConfig(max_new_tokens=12, temperature=0.0, batch_size=2)


class IdsTokenizer:
    """Replies as their token ids, so that tests compare tokens: '5 17 3'."""

    eos_token_id = 2

    def convert_tokens_to_ids(self, token):
        return None

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def reference_reply(model, ids: list[int], max_new: int) -> str:
    out = hf_greedy(model, torch.tensor([ids]), max_new)[0, len(ids):].tolist()
    return " ".join(map(str, out[:out.index(2)] if 2 in out else out))


@pytest.mark.parametrize("dtype,cache_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                               (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize("heads,kv_heads,dim,window,softcap", [(9, 3, 64, 0, 0.0), (4, 2, 16, 0, 0.0),
                                                                (8, 8, 128, 5, 0.0), (6, 3, 40, 3, 0.0), (9, 3, 64, 0, 2.0)])
def test_the_kernel_writes_and_attends_as_torch_does(dtype, cache_dtype, heads, kv_heads, dim, window, softcap):
    """Each row writes its key and value at lengths - 1 of its slot and attends over its visible positions
    (a window's, soft-capped scores); rows of other slots and positions past a row's length are untouched (the
    vector paths at dims 64 and 128); two rows of one slot see each other as a prompt's tokens do. fp32 rows over
    bf16 caches write their keys and values rounded to bf16."""
    native = slot_attention.kernel()
    assert native is not None, "the C++ kernel must build on a CPU with a compiler (inductor needs one too)"
    g = torch.Generator().manual_seed(heads * dim + window)
    rand = lambda *shape, dtype=dtype: torch.randn(*shape, generator=g).to(dtype)
    q, k, v = rand(4, heads, dim), rand(4, kv_heads, dim), rand(4, kv_heads, dim)
    keys, values = rand(6, kv_heads, 40, dim, dtype=cache_dtype), rand(6, kv_heads, 40, dim, dtype=cache_dtype)
    slots, lengths = torch.tensor([3, 0, 5, 3]), torch.tensor([1, 17, 40, 2])
    ref_keys, ref_values = keys.clone(), values.clone()
    out = native.slot_decode(q, k, v, keys, values, slots, lengths, dim**-0.5, window, softcap)
    ref = slot_attention.reference_decode(q, k, v, ref_keys, ref_values, slots, lengths, dim**-0.5, window, softcap)
    assert torch.equal(keys, ref_keys) and torch.equal(values, ref_values) and out.dtype == dtype
    tolerance = dict(atol=1e-5, rtol=0) if dtype == torch.float32 else dict(atol=8e-3, rtol=8e-3)  # bf16: its last bit
    torch.testing.assert_close(out.float(), ref.float(), **tolerance)


def test_the_kernel_refuses_bf16_rows_over_fp32_caches():
    cache = torch.zeros(2, 1, 8, 16)
    kv = torch.zeros(1, 1, 16, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="not BFloat16 over Float"):
        slot_attention.kernel().slot_decode(kv, kv, kv, cache, cache.clone(), torch.tensor([0]), torch.tensor([1]),
                                            0.25, 0, 0.0)


def test_the_kernel_names_a_row_outside_the_cache():
    native = slot_attention.kernel()
    q, kv = torch.zeros(1, 2, 16), torch.zeros(1, 1, 16)
    cache = torch.zeros(2, 1, 8, 16)
    with pytest.raises(RuntimeError, match="row 0 has slot 0 and length 9 outside the cache"):
        native.slot_decode(q, kv, kv, cache, cache.clone(), torch.tensor([0]), torch.tensor([9]), 0.25, 0, 0.0)


@pytest.mark.parametrize("kernel,compiled", [("native", True), ("native", False), ("torch", False)])
def test_greedy_replies_equal_the_targets_own_with_requests_queued_for_slots(kernel, compiled, monkeypatch):
    """Five prompts of different lengths through two slots, read 7 prompt tokens a step (the longer ones in
    chunks): each reply is HF's greedy reply to its prompt alone, with the C++ kernel and with torch's, in the
    compiled step and eagerly."""
    if kernel == "torch":
        monkeypatch.setattr(slot_attention, "kernel", lambda: None)
    model = tiny_llama(seed=5)
    engine = BatchedDecoding(model, IdsTokenizer(), GREEDY, 64, compile=compiled, prefill_tokens=7)
    prompts = [prompt(seed, length)[0].tolist() for seed, length in enumerate([5, 11, 3, 20, 8])]
    engine.submit([Request(i, p, seed=0) for i, p in enumerate(prompts)], GREEDY)
    replies: dict = {}
    while len(replies) < len(prompts):
        replies.update(engine.finished())
    assert replies == {i: reference_reply(model, p, GREEDY.max_new_tokens) for i, p in enumerate(prompts)}
    assert engine.tokens == sum(len(r.split()) for r in replies.values()) and engine.seconds > 0
    assert engine.compiled_once == compiled


def test_an_fp32_target_over_a_bf16_cache_decodes_as_the_reference_does(monkeypatch):
    """fp32 arithmetic over bf16 keys and values (a bf16 run on a CPU without bf16 arithmetic): the compiled
    step through the C++ kernel writes the replies of the eager step through torch's reference, from a cache of
    half the bytes."""
    model = tiny_llama(seed=5)
    prompts = [prompt(seed, length)[0].tolist() for seed, length in enumerate([5, 11, 3, 20, 8])]

    def replies(compiled: bool) -> tuple[dict, BatchedDecoding]:
        engine = BatchedDecoding(model, IdsTokenizer(), GREEDY, 64, compile=compiled, prefill_tokens=7,
                                 kv_dtype=torch.bfloat16)
        engine.submit([Request(i, p, seed=0) for i, p in enumerate(prompts)], GREEDY)
        out: dict = {}
        while len(out) < len(prompts):
            out.update(engine.finished())
        return out, engine

    native, engine = replies(compiled=True)
    assert engine.cache.keys[0].dtype == torch.bfloat16 and engine.compiled_once
    assert engine.cache.bytes == BatchedDecoding(model, IdsTokenizer(), GREEDY, 64, compile=False).cache.bytes // 2
    monkeypatch.setattr(slot_attention, "kernel", lambda: None)
    assert replies(compiled=False)[0] == native


def test_replies_that_end_leave_the_others_decoding_as_they_would_alone(tiny_dir):
    """Rows end at different steps (end tokens chosen from the replies alone); the rows left keep decoding
    exactly as they would alone (fp32, greedy), and the steps shrink as they end."""
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    prompts = [tok(text)["input_ids"] for text in ("a", "the cat sat on", "one two three four five six", "x y")]
    alone = [hf_greedy(model, torch.tensor([p]), 12)[0, len(p):].tolist() for p in prompts]
    stops = {alone[0][2], alone[1][6]}  # rows end at different steps (some may run to the budget)
    settings = replace(GREEDY, batch_size=4)
    engine = BatchedDecoding(model, tok, settings, 64, compile=False)
    engine.eos_ids = stops
    expected = []
    for reply in alone:
        end = next((j for j, t in enumerate(reply) if t in stops), len(reply))
        expected.append(tok.decode(reply[:end], skip_special_tokens=True).strip())
    assert sum(len(e) < len(tok.decode(a, skip_special_tokens=True).strip()) for e, a in zip(expected, alone)) >= 2
    rows = []
    model.register_forward_pre_hook(lambda m, args, kw: rows.append(kw["input_ids"].shape[1]), with_kwargs=True)
    assert ReplyGenerator(engine, tok, settings, 64).decode_batch(prompts) == expected
    assert rows[0] == sum(len(p) for p in prompts) and rows[1] == 4 and rows[-1] < 4  # prompts, then one row a reply


def test_a_conversations_next_turn_reuses_its_slot_and_replies_as_if_prefilled_whole(tiny_dir):
    """Whole conversations turn by turn (the ChatML template of the embedded default), three in flight on two
    slots: a conversation's next turn goes back to its slot ahead of the third conversation's first, so at
    least its previous prompt is reused, and each reply still equals HF's greedy reply to that turn's whole
    prompt."""
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    settings = replace(GREEDY, max_turns=3, concurrency=3, max_new_tokens=6, batch_size=2)
    engine = BatchedDecoding(model, tok, settings, 256, compile=False)
    seen: list[Request] = []
    submit = engine.submit
    engine.submit = lambda requests, s: (seen.extend(requests), submit(requests, s))
    user = lambda text: {"role": "user", "content": text}
    chunk = [Conversation(i, f"c{i}", [user(f"question {i}"), user("and then?"), user("why?")]) for i in range(3)]
    out = dict(ReplyGenerator(engine, tok, settings, 256).chunks({0: chunk}, {0: 0}))
    assert len(seen) == 9 and engine.reused + engine.prefilled == sum(len(r.prompt) for r in seen)
    earlier = {(r.key, r.seed + 1): len(r.prompt) for r in seen}  # the next turn's seed is one more
    assert engine.reused >= sum(earlier.get((r.key, r.seed), 0) for r in seen) > 0
    for request in seen:
        reply = hf_greedy(model, torch.tensor([request.prompt]), 6)[0, len(request.prompt):].tolist()
        reply = reply[:reply.index(tok.eos_token_id)] if tok.eos_token_id in reply else reply
        conversation = out[0][request.key[1]].messages
        turn = (request.seed - request.key[1] * 3)
        assert conversation[2 * turn + 1]["content"] == tok.decode(reply, skip_special_tokens=True).strip()


def test_a_sampled_reply_depends_on_its_seed_not_on_its_batch():
    model = tiny_llama(seed=6)
    sampled = RegenConfig(max_new_tokens=10, temperature=1.0, top_p=0.9, batch_size=3)
    p = prompt(1, 6)[0].tolist()

    def replies(requests):
        engine = BatchedDecoding(model, IdsTokenizer(), sampled, 64, compile=False)
        engine.submit(requests, sampled)
        out: dict = {}
        while len(out) < len(requests):
            out.update(engine.finished())
        return out

    alone = replies([Request("a", p, seed=11)])["a"]
    crowded = replies([Request("x", prompt(2, 9)[0].tolist(), seed=3), Request("a", p, seed=11),
                       Request("y", p, seed=12)])
    assert crowded["a"] == alone and crowded["y"] != alone


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_a_sliding_window_or_soft_capped_target_replies_as_it_does_alone(family):
    """Mistral's sliding window; Gemma 2's window on every other layer, soft-capped scores and its own scale."""
    torch.manual_seed(0)
    sizes = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, sliding_window=4, eos_token_id=2)
    if family == "mistral":
        model = MistralForCausalLM(MistralConfig(**sizes, attn_implementation="sdpa")).eval()
    else:
        model = Gemma2ForCausalLM(Gemma2Config(**sizes, head_dim=16, attn_logit_softcapping=5.0, query_pre_attn_scalar=24,
                                               attn_implementation="eager")).eval()
    engine = BatchedDecoding(model, IdsTokenizer(), GREEDY, 64, compile=False)
    p = prompt(4, 9)[0].tolist()
    engine.submit([Request(0, p, seed=0)], GREEDY)
    assert dict(engine.finished()) == {0: reference_reply(model, p, GREEDY.max_new_tokens)}
