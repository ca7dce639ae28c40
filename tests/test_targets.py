"""Targets as the presets name them: Hub ids (weights in either format, gated repos), local folders
with PyTorch `.bin` weights and a SentencePiece `tokenizer.model`, and the BOS Vicuna's server feeds."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from data_prep.template import tokenize_conversation
from eagle.targets.resolve import hub_patterns, load_target, resolve_target
from eagle.targets.tokenizer import chat_prompt, load_tokenizer
from tests.tiny import tiny_llama
from train.frozen import load_frozen


def sentencepiece_folder(tmp_path, vocab_size: int = 128):
    """A tiny Llama saved as `pytorch_model.bin` with a trained SentencePiece `tokenizer.model`, as
    lmsys/vicuna-*-v1.3 ship on their main branch (no safetensors, no tokenizer.json)."""
    import sentencepiece as spm

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(["USER: hello there ASSISTANT: hi, how can I help you today?"] * 40 +
                                [f"The quick brown fox jumps over the lazy dog {i}." for i in range(200)]))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "sp"), vocab_size=vocab_size,
                                   model_type="bpe", bos_id=1, eos_id=2, unk_id=0, pad_id=-1, minloglevel=2)
    folder = tmp_path / "vicuna-tiny"
    model = tiny_llama(seed=1, vocab_size=vocab_size)
    model.config.save_pretrained(folder)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    (folder / "tokenizer.model").write_bytes((tmp_path / "sp.model").read_bytes())
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
         "add_bos_token": True, "add_eos_token": False}))
    return folder, model


def test_a_bin_and_sentencepiece_folder_loads_through_the_preset_resolver(tmp_path):
    folder, model = sentencepiece_folder(tmp_path)
    path = resolve_target(str(folder))  # what model.path goes through in data_prep, train and the decoder
    target = load_target(path, torch.float32, "cpu")
    ids = torch.tensor([[1, 5, 9, 30]])
    torch.testing.assert_close(target(ids).logits, model(ids).logits)
    frozen = load_frozen(path)  # the trainer reads only these matrices, from the memory-mapped .bin
    assert torch.equal(frozen.embed, model.model.embed_tokens.weight)
    assert torch.equal(frozen.lm_head, model.lm_head.weight)
    assert torch.equal(frozen.norm, model.model.norm.weight)


def test_vicuna_features_start_with_bos_as_served(tmp_path):
    """EAGLE's Vicuna prompts and every server start with <s>; data_prep tokenizes the rendered
    template without adding special tokens, so the template itself must carry it."""
    folder, _ = sentencepiece_folder(tmp_path)
    tokenizer = load_tokenizer(folder, "vicuna")
    messages = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi, how can I help?"}]
    tokens = tokenize_conversation(tokenizer, messages, max_len=256)
    assert tokens.input_ids[0] == tokenizer.bos_token_id and tokens.input_ids.count(tokenizer.bos_token_id) == 1
    assert any(tokens.loss_mask) and not tokens.loss_mask[0]
    prompt = chat_prompt(tokenizer, messages[:1])
    assert prompt[0, 0] == tokenizer.bos_token_id and tokens.input_ids[: prompt.shape[1]] == prompt[0].tolist()


def test_hub_downloads_take_one_weight_format():
    vicuna13b = ["config.json", "pytorch_model-00001-of-00003.bin", "pytorch_model.bin.index.json",
                 "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"]
    assert "*.bin" in hub_patterns(vicuna13b) and "*.model" in hub_patterns(vicuna13b)
    both = vicuna13b + ["model-00001-of-00003.safetensors", "model.safetensors.index.json"]
    assert "*.safetensors" in hub_patterns(both) and "*.bin" not in hub_patterns(both)
    with pytest.raises(FileNotFoundError, match="no model weights"):
        hub_patterns(["README.md", "config.json"])


class GatedHub(BaseHTTPRequestHandler):
    """Answers every request as the Hub answers a gated repo to a user without access."""

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        body = b'{"error": "Access to model meta-llama/Llama-2-7b-chat-hf is restricted."}'
        self.send_response(401)
        self.send_header("X-Error-Code", "GatedRepo")
        self.send_header("X-Error-Message", "Access to model meta-llama/Llama-2-7b-chat-hf is restricted.")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET


def test_a_gated_preset_without_a_token_is_one_clear_line(monkeypatch, tmp_path):
    from huggingface_hub import constants

    server = ThreadingHTTPServer(("127.0.0.1", 0), GatedHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    try:
        with pytest.raises(FileNotFoundError) as err:
            resolve_target("meta-llama/Llama-2-7b-chat-hf")
    finally:
        server.shutdown()
        server.server_close()
    message = str(err.value)
    assert "\n" not in message and "gated" in message and "HF_TOKEN" in message


def test_a_preset_written_for_a_base_model_uses_its_familys_template(tmp_path):
    """`python -m eagle.targets --preset NAME PATH`: the sizes plan=true needs, and a base model
    (a tokenizer without a chat template) gets the shipped template of its family."""
    from omegaconf import OmegaConf

    from eagle.targets.preset import write_preset
    from tests.families import family_target

    folder, _ = sentencepiece_folder(tmp_path)
    family_target("gemma3", 0).save_pretrained(folder)  # a Gemma-3 base model with a plain tokenizer
    (tmp_path / "conf" / "model").mkdir(parents=True)
    out = write_preset("mine", "some/gemma.gguf", folder, conf=tmp_path / "conf")
    m = OmegaConf.load(out).model
    assert (m.name, m.path, m.chat_template, m.num_layers, m.hidden_size, m.vocab_size) == (
        "mine", "some/gemma.gguf", "gemma", 3, 64, 128)
    assert 0 < m.params < 1e6 and m.max_len == 512


def test_a_gguf_files_metadata_is_parsed_once_while_converting(tmp_path):
    """convert_gguf's tokenizer, config and weights share one GGUFReader per file, and its modules one
    tensor-name map per architecture and depth; outside the conversion the library's functions are back."""
    import gguf
    import numpy as np

    from eagle.targets.gguf import _one_parse

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    original, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    llama = gguf.MODEL_ARCH.LLAMA
    with _one_parse():
        first, again, other = gguf.GGUFReader(path), gguf.GGUFReader(str(path)), gguf.GGUFReader(path, "r")
        assert first is again and other is not first
        assert [t.name for t in first.tensors] == ["token_embd.weight"]
        assert type(first.data) is np.ndarray  # read into memory: a memmap's slices are slow
        assert np.array_equal(first.tensors[0].data, np.zeros((4, 8), dtype=np.float32))
        assert gguf.get_tensor_name_map(llama, 2) is gguf.get_tensor_name_map(llama, 2)
        assert gguf.get_tensor_name_map(llama, 3) is not gguf.get_tensor_name_map(llama, 2)
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (original, name_map)
    assert type(gguf.GGUFReader(path).data) is np.memmap and gguf.gguf_reader.np is np
    assert gguf.get_tensor_name_map(llama, 2) is not gguf.get_tensor_name_map(llama, 2)
