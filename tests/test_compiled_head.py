"""The draft head at fixed shapes (eagle/compiled/head_graphs.py): its compiled forward over a preallocated
buffer gives the eager head's outputs and drafts (fp32), for one- and two-layer EAGLE-2 and EAGLE-3
heads, with padded rows and across a buffer that grows; each shape compiles once."""

import pytest
import torch

from eagle.compiled.head_graphs import CompiledHead, HeadRows
from eagle.model import EaModel
from eagle.decoding.settings import TreeSettings
from tests.tiny import prompt, random_eagle3_head, random_head, tiny_llama

SETTINGS = TreeSettings(total_token=8, depth=3, top_k=3)


def _pair(kind: str):
    target = tiny_llama(seed=3)
    layers = int(kind[-1])
    if kind.startswith("eagle3"):
        head = random_eagle3_head(target, num_hidden_layers=layers)
    else:
        head = random_head(target, seed=4, layers=layers)
    return [EaModel(target, head, settings=SETTINGS, compile=compile) for compile in (False, True)]


@pytest.mark.parametrize("kind", ["layers1", "layers2", "eagle3_layers1", "eagle3_layers2"])
def test_compiled_head_encodes_and_drafts_what_the_eager_head_does(kind):
    """Prefill, then commits of 1-8 rows that carry the cache from the 256-row buffer into a 512-row one,
    and a 3-level draft after each: the same head outputs, draft log-probs and candidates."""
    models = _pair(kind)
    ids = prompt(0, 180)
    width = models[0].head.fc.in_features // 2 if not kind.startswith("eagle3") else models[0].head.fc.in_features
    commits = (1, 3, 8, 5, 8, 8, 8, 8, 8, 8, 8, 8)
    with torch.inference_mode():
        states = [m.prefill(ids)[0] for m in models]
        assert isinstance(states[1].head_past, HeadRows) and models[1].drafter.compiled.size == 256
        for step, n in enumerate(commits):
            outs = []
            for model, state in zip(models, states, strict=True):
                features = torch.randn(n, width, generator=torch.Generator().manual_seed(step))
                tokens = torch.arange(step, step + n)
                positions = torch.arange(state.committed, state.committed + n)
                hidden, logp, past = model.drafter.encode(features, tokens, positions, None, state.head_past, 1)
                state = type(state)(torch.cat([state.ids, tokens[None]], 1), state.target_cache, past, hidden[-1:],
                                    logp)
                outs.append((hidden, model.draft_candidates(state, 3), state))
            (h0, c0, s0), (h1, c1, s1) = outs
            torch.testing.assert_close(h1, h0, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(s1.draft_logp, s0.draft_logp, rtol=1e-4, atol=1e-4)  # last row, padded or not
            assert torch.equal(c1[0], c0[0]) and torch.equal(c1[2], c0[2]), step  # tokens and parents
            torch.testing.assert_close(c1[1], c0[1], rtol=1e-4, atol=1e-4)
            states = [s0, s1]
    runner = models[1].drafter.compiled
    assert runner.size == 512 and states[1].head_past == HeadRows(180 + sum(commits))
    heads = [shape[1:] for shape in runner.shapes]  # (rows, feature width, scored rows), every buffer length
    assert {rows for rows, _, _ in heads} == {1, 4, 8}
    assert {scored for rows, _, scored in heads} == {1, 4}  # commits score their last row, drafts every row


def test_a_state_keeps_its_head_rows_while_drafts_are_written_after_them():
    """Drafting twice from one state, with another state's draft between, gives the same candidates:
    drafted rows land past the committed ones and never change them."""
    _, model = _pair("layers1")
    with torch.inference_mode():
        state, _ = model.prefill(prompt(1, 20))
        first = model.draft_candidates(state, 3)
        model.draft_candidates(state, 2, top_k=2)
        again = model.draft_candidates(state, 3)
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)


def test_padded_rows_see_only_themselves():
    """A row's output does not depend on the padding: 3 rows padded to 4 give 3 rows of a 3-row eager call,
    and the scorer in the same graph gives those rows' draft log-probs (all of them, or the last)."""
    target = tiny_llama(seed=5)
    head = random_head(target, seed=6)
    scorer = torch.nn.Linear(64, 10)
    runner = CompiledHead(head, scorer)
    torch.manual_seed(0)
    past = (torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16))
    embeds, features = torch.randn(3, 64), torch.randn(3, 64)
    with torch.inference_mode():
        mask = torch.cat([torch.zeros(3, 9), torch.full((3, 3), float("-inf")).triu(1)], 1)[None, None]
        eager, _ = head(features[None], embeds[None], torch.arange(9, 12)[None], mask, past)
        expected = scorer(eager[0]).log_softmax(dim=-1)  # [3, 10]
        start = runner.start(past)
        compiled, logp, rows = runner.encode(embeds, features, torch.arange(9, 12), None, start)
        _, every, _ = runner.encode(embeds, features, torch.arange(9, 12), None, start, scored=3)
        _, last, _ = runner.encode(embeds, features, torch.arange(9, 12), None, start, scored=1)
    torch.testing.assert_close(compiled, eager[0], rtol=1e-5, atol=1e-5)
    assert logp is None and rows == HeadRows(12)
    torch.testing.assert_close(every, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(last, expected[2:], rtol=1e-5, atol=1e-5)
    assert runner.shapes == {("head", 4, 64, 0), ("head", 4, 64, 4), ("head", 4, 64, 1)}
