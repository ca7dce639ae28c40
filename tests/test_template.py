"""The assistant-only loss mask, derived from the chat template, for several templates."""

import pytest

from data_prep.template import TemplateError, tokenize_conversation
from eagle.targets.tokenizer import chat_template_text, load_tokenizer
from tests.tiny import embedded_target_or_skip

MESSAGES = [
    {"role": "system", "content": "You answer tersely."},
    {"role": "user", "content": "Name a prime number."},
    {"role": "assistant", "content": "Seven is prime."},
    {"role": "user", "content": "And an even one?"},
    {"role": "assistant", "content": "Two, the only even prime."},
]


MARKERS = {"llama3": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
           "gemma": ["<start_of_turn>", "<end_of_turn>"], "phi3": ["<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]}


@pytest.fixture(scope="module")
def target_dir():
    return embedded_target_or_skip()


def masked_text(tok, t):
    return tok.decode([i for i, m in zip(t.input_ids, t.loss_mask) if m])


@pytest.mark.parametrize("template, end", [(None, "<|im_end|>"), ("vicuna", "<|im_end|>"), ("llama2", " <|im_end|>"),
                                           ("chatml", "<|im_end|>"), ("llama3", "<|eot_id|>"),
                                           ("gemma", "<end_of_turn>"), ("mistral", "<|im_end|>"), ("phi3", "<|end|>")])
def test_mask_covers_exactly_assistant_replies_and_end_of_turn(target_dir, template, end):
    tok = load_tokenizer(target_dir, template)
    tok.add_tokens(MARKERS.get(template, []), special_tokens=True)  # atomic, as in the family's own tokenizer
    t = tokenize_conversation(tok, MESSAGES, max_len=4096)
    assert len(t.input_ids) == len(t.loss_mask)
    assert tok.decode(t.input_ids) == tok.apply_chat_template(MESSAGES, tokenize=False)
    expected = "".join(m["content"] + end for m in MESSAGES if m["role"] == "assistant")
    assert masked_text(tok, t).replace(" ", "") == expected.replace(" ", "")
    unmasked = tok.decode([i for i, m in zip(t.input_ids, t.loss_mask) if not m])
    for m in MESSAGES:
        if m["role"] != "assistant":
            assert m["content"] in unmasked


def test_truncation_at_max_len(target_dir):
    tok = load_tokenizer(target_dir)
    full = tokenize_conversation(tok, MESSAGES, max_len=4096)
    cut = tokenize_conversation(tok, MESSAGES, max_len=40)
    assert len(cut.input_ids) == 40
    assert cut.input_ids == full.input_ids[:40] and cut.loss_mask == full.loss_mask[:40]


def test_template_that_rewrites_history_is_rejected(target_dir):
    tok = load_tokenizer(target_dir)
    # drops every assistant turn but the last: not prefix-stable
    tok.chat_template = ("{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
                         "{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endif %}{% endfor %}"
                         "{% if add_generation_prompt %}assistant: {% endif %}")
    with pytest.raises(TemplateError):
        tokenize_conversation(tok, MESSAGES, max_len=4096)


def test_template_names_and_errors(tmp_path):
    assert "ASSISTANT" in chat_template_text("vicuna")
    (tmp_path / "t.jinja").write_text("{{ messages }}")
    assert chat_template_text(str(tmp_path / "t.jinja")) == "{{ messages }}"
    with pytest.raises(ValueError, match="unknown chat template"):
        chat_template_text("no-such-template")
