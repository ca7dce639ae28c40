"""`data.mask_repeats`: a reply's loops leave the loss, the first pass of them stays."""

import pytest

from data_prep.repeats import mask_repeats


def test_a_loop_leaves_the_loss_after_its_first_pass_and_n_minus_one_more_tokens():
    reply = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4]  # a 4-token loop, three times
    ids, mask = [9, 9] + reply, [0, 0] + [1] * len(reply)  # a prompt, then the reply
    assert mask_repeats(ids, mask, 3) == [0, 0] + [1, 1, 1, 1, 1, 1] + [0] * 6  # (1,2,3) repeats at "3" of pass 2
    assert mask_repeats(ids, mask, 5) == [0, 0] + [1] * 8 + [0] * 4
    assert mask_repeats(ids, mask, 9) == mask  # no 9-gram repeats


def test_only_reply_tokens_count_and_ngrams_do_not_span_the_prompt():
    ids = [1, 2, 3, 1, 2, 3, 7, 1, 2, 3]
    mask = [0, 0, 0, 1, 1, 1, 0, 1, 1, 1]  # the prompt says 1 2 3; two replies say it again
    assert mask_repeats(ids, mask, 3) == [0, 0, 0, 1, 1, 1, 0, 1, 1, 0]  # the second reply repeats the first
    assert mask_repeats(ids, mask, 4) == mask  # no run of 4 reply tokens


def test_text_without_repeats_is_unchanged_and_bad_n_is_named():
    ids = list(range(50))
    assert mask_repeats(ids, [1] * 50, 2) == [1] * 50
    with pytest.raises(ValueError, match="data.mask_repeats=0"):
        mask_repeats(ids, [1] * 50, 0)
