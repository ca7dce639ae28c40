"""experiments.datastore_chain: a store's chain, and the walk that scores it beside the head's tree."""

from experiments.datastore_chain import Store, walk


def test_a_store_follows_the_longest_suffix_it_holds_then_the_majority_continuation():
    store = Store([[6, 2, 3, 4, 5], [7, 2, 3, 4, 6], [8, 2, 3, 9], [0, 1, 2, 3, 9, 9], [5, 2, 3, 4, 5]])
    # (1, 2, 3) is held once: its own continuation, not the majority's of (2, 3)
    assert store.chain([5, 1, 2, 3], 3) == [9, 9]
    # (2, 3) alone: 4 follows three times, 9 twice; after (2, 3, 4), 5 twice and 6 once
    assert store.chain([0, 0, 2, 3], 3) == [4, 5]
    assert store.chain([5, 5], 2) == []
    assert store.tokens == 25


def test_the_walk_starts_a_step_past_what_the_last_one_accepted():
    # positions 0..5 of one text; the tree accepts 1 or 2, a chain of 2 rows matches 3 tokens at position 1
    accepted = [1, 2, 1, 1, 2, 1]
    chain = [(0, 0), (2, 3), (0, 0), (0, 0), (0, 0), (0, 0)]
    tau, rows = walk(accepted, chain, [6], 4)
    # steps start at 0 (1 token), 1 (chain: 4 tokens), 5 (1 token)
    assert (tau, rows) == (2.0, 2 / 3)
