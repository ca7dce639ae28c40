"""experiments/first_use.py: its summary of a model used the moment it loads."""

from experiments.first_use import summary


def test_summary_splits_the_replies_at_the_first_compiled_one():
    rows = [{"at_s": 2.0, "tok_s": 40.0, "compiled": False}, {"at_s": 9.0, "tok_s": 50.0, "compiled": False},
            {"at_s": 60.5, "tok_s": 120.0, "compiled": True}, {"at_s": 61.0, "tok_s": 140.0, "compiled": True},
            {"at_s": 62.0, "tok_s": 100.0, "compiled": True}]
    assert summary(rows) == {"replies": 5, "compiled_after_s": 60.5, "eager_tok_s": 45.0, "compiled_tok_s": 120.0}


def test_summary_of_a_model_that_stays_eager_has_no_compiled_reply():
    rows = [{"at_s": 2.0, "tok_s": 40.0, "compiled": False}]
    assert summary(rows) == {"replies": 1, "compiled_after_s": None, "eager_tok_s": 40.0, "compiled_tok_s": None}
