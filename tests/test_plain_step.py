"""`EaModel(compile=True)`: plain decoding through compiled one-token forwards over a bucketed static
cache (eagle/plain_step.py) gives HF generate's greedy output (fp32) and compiles once per bucket."""

import torch
from transformers import MistralConfig, MistralForCausalLM

from eagle.model import EaModel
from eagle.plain_step import BUCKET, CompiledStep, EagerStep, bucket, plain_step
from tests.tiny import FIXED, hf_greedy, prompt, random_head, tiny_llama


def test_buckets_double_from_256():
    assert [bucket(n) for n in (1, 256, 257, 700, 1025)] == [256, 256, 512, 1024, 2048] and BUCKET == 256


def test_compiled_plain_decoding_equals_hf_generate_and_compiles_once_per_bucket():
    target = tiny_llama(seed=1)
    model = EaModel(target, random_head(target), settings=FIXED, compile=True)
    assert isinstance(model.plain, CompiledStep)
    for seed, length in ((0, 9), (1, 23)):  # two prompt lengths, one bucket: one graph
        ids = prompt(seed, length)
        assert torch.equal(model.naivegenerate(ids, max_new_tokens=30), hf_greedy(target, ids, 30)), seed
    assert model.plain._sizes == {256} and model.plain.compile_seconds > 0
    compiled_once = model.plain.compile_seconds
    long = prompt(2, 240)  # 240 + 30 rows: the 512 bucket compiles
    assert torch.equal(model.naivegenerate(long, max_new_tokens=30), hf_greedy(target, long, 30))
    assert model.plain._sizes == {256, 512} and model.plain.compile_seconds > compiled_once


def test_targets_with_sliding_windows_keep_the_eager_step():
    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=16)
    assert isinstance(plain_step(MistralForCausalLM(cfg).eval(), compile=True), EagerStep)
    assert isinstance(plain_step(tiny_llama(), compile=False), EagerStep)
