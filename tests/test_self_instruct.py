"""Self-instructed chats (data_prep.self_instruct) on a tiny random target with the real ChatML tokenizer."""

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from data_prep.batched_decoding import BatchedDecoding
from data_prep.conversations import read_conversations
from data_prep.regenerate import ReplyGenerator
from data_prep.self_instruct import (
    answer,
    follow_up,
    question_prefix,
    read_openers,
    sample_questions,
    write_sharegpt,
)
from eagle.targets.tokenizer import load_tokenizer


def replies_by(model, tok, settings, max_len: int) -> ReplyGenerator:
    """A reply generator on our batched decoding of `model` (batches of settings.batch_size, else 4)."""
    engine = BatchedDecoding(model, tok, OmegaConf.merge({"batch_size": 4}, settings), max_len)
    return ReplyGenerator(engine, tok, settings, max_len)


def test_question_prefix_stops_where_the_users_text_starts(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    prefix = question_prefix(tok)
    whole = tok.apply_chat_template([{"role": "user", "content": "Why is the sky blue?"}], tokenize=False)
    assert tok.decode(prefix).endswith("user\n") and whole.startswith(tok.decode(prefix))
    assert whole[len(tok.decode(prefix)):].startswith("Why is the sky blue?")


def test_questions_are_distinct_sampled_and_answered_into_a_readable_sharegpt_file(tiny_dir, tmp_path):
    tok = load_tokenizer(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    asking = OmegaConf.create({"max_new_tokens": 12, "temperature": 1.0, "top_p": 1.0})
    torch.manual_seed(0)
    questions = sample_questions(replies_by(model, tok, asking, 128), n=6, batch_size=4, min_words=2,
                                 max_rounds=6)
    assert len(questions) == 6 and len({" ".join(q.lower().split()) for q in questions}) == 6
    replying = OmegaConf.create({"max_new_tokens": 8, "temperature": 0.0, "top_p": 1.0, "max_turns": 1, "batch_size": 4, "concurrency": 4})
    chats = answer(replies_by(model, tok, replying, 128), questions)
    assert chats and all([m["role"] for m in c.messages] == ["user", "assistant"] for c in chats)
    out = tmp_path / "self.json"
    write_sharegpt(chats, out)
    back, _ = read_conversations(str(out))
    assert [c.messages for c in back] == [c.messages for c in chats]  # the pipeline reads what was written


def test_openers_start_the_questions_in_turn(tiny_dir, tmp_path):
    tok = load_tokenizer(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    asking = OmegaConf.create({"max_new_tokens": 6, "temperature": 1.0, "top_p": 1.0})
    path = tmp_path / "openers.txt"
    path.write_text("# a comment\nExtract\n\n  Explain how  \n")
    openers = read_openers(str(path))
    assert openers == ["Extract", "Explain how"]
    torch.manual_seed(0)
    questions = sample_questions(replies_by(model, tok, asking, 128), n=4, batch_size=4, min_words=1,
                                 max_rounds=4, openers=openers)
    assert len(questions) == 4
    assert sum(q.startswith("Extract") for q in questions) == sum(q.startswith("Explain how ") for q in questions) == 2
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n")
    with pytest.raises(ValueError, match="empty.txt: no openers"):
        read_openers(str(empty))


def test_follow_up_adds_a_sampled_question_after_the_targets_reply_and_answers_it(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    history = [{"role": "user", "content": "Why is the sky blue?"}, {"role": "assistant", "content": "Rayleigh scattering."}]
    prefix = tok.decode(question_prefix(tok, history))
    assert prefix.startswith(tok.apply_chat_template(history, tokenize=False)) and prefix.endswith("user\n")

    asking = OmegaConf.create({"max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0, "batch_size": 4})
    replying = OmegaConf.create({"max_new_tokens": 6, "temperature": 0.0, "top_p": 1.0, "max_turns": 1, "batch_size": 4, "concurrency": 4})
    replier = replies_by(model, tok, replying, 128)
    chats = answer(replier, ["Name three rivers of Europe.", "What is two plus two?", "Explain how tides work."])
    torch.manual_seed(0)
    longer = follow_up(replies_by(model, tok, asking, 128), replier, chats, min_words=1)
    assert [c.id for c in longer] == [c.id for c in chats]
    assert all(c2.messages[:2] == c1.messages for c1, c2 in zip(chats, longer))  # the first turn is kept as it was
    assert any(len(c.messages) == 4 for c in longer)
    for c in longer:
        assert [m["role"] for m in c.messages] in (["user", "assistant"], ["user", "assistant", "user", "assistant"])
    tight = follow_up(replies_by(model, tok, asking, 16), replier, chats, min_words=1)
    assert [c.messages for c in tight] == [c.messages for c in chats]  # no room for a follow-up: unchanged
