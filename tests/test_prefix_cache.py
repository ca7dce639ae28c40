"""`prefix_cache=True` (eagle/decoding/prefix_cache.py): a chat's next turn takes the KV rows of the previous
generation for the tokens it shares with it, prefills only the rest, and decodes exactly as a fresh prefill
would (fp32 greedy: HF generate's tokens); eager and compiled runners, EAGLE and plain decoding."""

import pytest
import torch

from eagle.decoding.prefix_cache import KeptRows, common_prefix, reusable
from eagle.decoding.settings import TreeSettings
from eagle.model import EaModel
from tests.tiny import hf_greedy, prompt, random_eagle3_head, random_head, tiny_llama

SMALL = TreeSettings(total_token=4, depth=2, top_k=2, lookup=0)  # few graph shapes to compile


def _kept(ids: list[int], head: bool = True) -> KeptRows:
    rows = len(ids) - 1
    kv = (torch.zeros(1, 2, rows, 4), torch.zeros(1, 2, rows, 4))
    return KeptRows(torch.tensor(ids), [kv, kv], kv if head else None)


def test_rows_are_reused_while_their_tokens_and_the_heads_next_tokens_are_shared():
    kept = _kept([10, 11, 12, 13, 14])  # 4 rows; 14 is the root, in neither cache
    assert common_prefix(torch.tensor([10, 11, 12]), torch.tensor([10, 11, 9, 13])) == 2
    assert kept.reusable(torch.tensor([10, 11, 12, 99, 98]), head=True) == 2  # head row 2 encodes (f_2, 13)
    assert kept.reusable(torch.tensor([10, 11, 12, 99, 98]), head=False) == 3
    assert kept.reusable(torch.tensor([10, 11, 12, 13, 14, 15]), head=True) == 4  # all rows
    assert kept.reusable(torch.tensor([10, 11, 12, 13, 14]), head=False) == 4  # the last token still runs
    assert kept.reusable(torch.tensor([10, 11, 12]), head=False) == 2
    assert kept.reusable(torch.tensor([9, 11]), head=False) == 0
    assert _kept([10, 11, 12], head=False).reusable(torch.tensor([10, 11, 12, 13]), head=True) == 0  # plain: no head
    assert reusable(None, torch.tensor([10]), head=True) == 0
    assert [k.shape[2] for k, _ in kept.target_rows(3)] == [3, 3] and kept.head_rows(1)[0].shape[2] == 1


def _turns(model: EaModel, target, method: str, seed: int = 0) -> None:
    """Three turns through the kept rows, each equal to HF's greedy decoding: the first keeps its rows, the
    second continues the first's output (all its rows reused), the third shares only the first prompt's start."""
    first = prompt(seed, 20)
    out = model.generate(first, max_new_tokens=12, method=method, prefix_cache=True)
    assert torch.equal(out, hf_greedy(target, first, 12)) and model.last_stats.cached_tokens == 0
    ids = torch.cat([out, prompt(seed + 1, 7)], dim=1)
    assert torch.equal(model.generate(ids, max_new_tokens=12, method=method, prefix_cache=True),
                       hf_greedy(target, ids, 12))
    assert model.last_stats.cached_tokens >= out.shape[1] - 1, method  # the last output token was never forwarded
    ids = torch.cat([first[:, :9], prompt(seed + 2, 6)], dim=1)
    assert torch.equal(model.generate(ids, max_new_tokens=12, method=method, prefix_cache=True),
                       hf_greedy(target, ids, 12))
    assert 0 < model.last_stats.cached_tokens <= 9, method


@pytest.mark.parametrize("head_kind", ["eagle2", "eagle3"])
def test_eager_turns_through_kept_rows_decode_as_hf_greedy(head_kind):
    target = tiny_llama(seed=4)
    head = random_head(target) if head_kind == "eagle2" else random_eagle3_head(target)
    model = EaModel(target, head, settings=SMALL, compile=False)
    for method in ("eagle", "naive"):
        model.generate(prompt(9, 5), max_new_tokens=2, method=method)  # prefix_cache=False keeps nothing
        _turns(model, target, method)
    model.generate(prompt(0, 20), max_new_tokens=4, prefix_cache=True)
    model.generate(prompt(0, 20), max_new_tokens=4, temperature=0.8, prefix_cache=True)  # sampling reuses them too
    assert model.last_stats.cached_tokens == 19  # all but the last prompt token


def test_compiled_turns_keep_their_rows_apart_from_other_decoders_of_the_target():
    """The compiled runner's buckets are shared by every decoder of a target: the kept rows are copies, and
    another decoder's reply between two turns leaves them as they were."""
    target = tiny_llama(seed=5)
    model = EaModel(target, random_head(target), settings=SMALL, compile=True)
    other = EaModel(target, random_eagle3_head(target), settings=SMALL, compile=True)
    assert model.runner is other.runner
    first = prompt(0, 20)
    model.eagenerate(first, max_new_tokens=12)  # compiles the graphs
    out = model.generate(first, max_new_tokens=12, prefix_cache=True)
    other.eagenerate(prompt(3, 40), max_new_tokens=12)  # overwrites the runner's bucket
    ids = torch.cat([out, prompt(1, 7)], dim=1)
    assert torch.equal(model.generate(ids, max_new_tokens=12, prefix_cache=True), hf_greedy(target, ids, 12))
    assert model.last_stats.cached_tokens >= out.shape[1] - 1
    _turns(model, target, "naive", seed=6)
