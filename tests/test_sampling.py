"""Rejection sampling is lossless: outputs follow the target distribution p (chi-square tests)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from eagle.model import EaModel
from eagle.decoding.settings import TreeSettings
from eagle.decoding.tree import build_tree
from eagle.decoding.verify import SamplingParams, target_probs, verify_sampling
from tests.families import family_target
from tests.tiny import bigram_head, near_bigram_pair, random_eagle3_head, random_head, subset, tiny_llama

SETTINGS = {
    "T=1": SamplingParams(1.0, 0.0, 0),
    "T=0.8,top_k=3": SamplingParams(0.8, 0.0, 3),
    "T=1.2,top_p=0.7": SamplingParams(1.2, 0.7, 0),
}



def chi_square_p_value(observed: Counter, expected: dict, draws: int) -> float:
    """Pearson chi-square; cells expecting fewer than 5 draws are pooled into one."""
    cells = set(expected) | set(observed)
    unexpected = [c for c in observed if expected.get(c, 0.0) == 0.0]
    assert not unexpected, f"outcomes with probability 0 were drawn: {unexpected[:5]}"
    big = [c for c in cells if expected[c] * draws >= 5]
    small = [c for c in cells if expected[c] * draws < 5]
    obs = [observed[c] for c in big] + ([sum(observed[c] for c in small)] if small else [])
    exp = [expected[c] * draws for c in big] + ([sum(expected[c] for c in small) * draws] if small else [])
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp) if e > 0)
    df = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


# ---- the verification step on a fixed tree ---------------------------------------------

#          0
#      1   2   3
#     4 5  6
#     7
PARENTS = torch.tensor([-1, 0, 0, 0, 1, 1, 2, 4])


def fixed_tree(logits: torch.Tensor, params: SamplingParams, good: bool):
    """Drafts: the top tokens of p (good) or arbitrary distinct tokens (bad, often p = 0)."""
    g = torch.Generator().manual_seed(5)
    tokens = torch.zeros(PARENTS.numel(), dtype=torch.long)
    children: dict[int, list[int]] = {}
    for node in range(1, PARENTS.numel()):
        children.setdefault(int(PARENTS[node]), []).append(node)
    for parent, kids in children.items():
        if good:
            ranked = target_probs(logits[parent], params).argsort(descending=True)
        else:
            ranked = torch.randperm(logits.shape[1], generator=g)
        tokens[kids] = ranked[: len(kids)]
    return build_tree(tokens, PARENTS)


def exact_step_distribution(tree, probs: torch.Tensor, max_len: int = 3) -> dict:
    """P(first emitted tokens): follow the tree while the emitted token is a child."""
    children = tree.children()
    out: dict[tuple, float] = {}

    def walk(node: int, prefix: tuple, mass: float) -> None:
        for token, p in enumerate(probs[node].tolist()):
            if p == 0.0:
                continue
            seq = prefix + (token,)
            child = next((c for c in children[node] if int(tree.tokens[c]) == token), None)
            if child is None or len(seq) == max_len:
                out[seq] = out.get(seq, 0.0) + mass * p
            else:
                walk(child, seq, mass * p)

    walk(0, (), 1.0)
    return out


@pytest.mark.parametrize("good", [True, False], ids=["good-drafts", "bad-drafts"])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_verify_sampling_matches_target_distribution(setting, good):
    params = SETTINGS[setting]
    vocab, draws = 6, 6000
    logits = torch.randn(PARENTS.numel(), vocab, generator=torch.Generator().manual_seed(11)) * 1.5
    tree = fixed_tree(logits, params, good)
    probs = target_probs(logits, params)
    expected = exact_step_distribution(tree, probs)
    torch.manual_seed(0)
    observed: Counter = Counter()
    lengths = Counter()
    for _ in range(draws):
        path, bonus = verify_sampling(tree, logits, params)
        emitted = tuple(tree.tokens[path[1:]].tolist()) + (bonus,)
        observed[emitted[:3]] += 1
        lengths[len(emitted)] += 1
    if good:
        assert lengths[1] < 0.8 * draws  # drafts are accepted, paths get long
    assert chi_square_p_value(observed, expected, draws) > 0.01


# ---- full generation on a tiny target ---------------------------------------------------


def exact_first_two(target, ids: torch.Tensor, params: SamplingParams) -> dict:
    """The target's joint distribution of the first two sampled tokens."""
    vocab = target.config.vocab_size
    with torch.no_grad():
        p1 = target_probs(target(ids).logits[0, -1], params)  # [V]
        seconds = torch.cat([ids.expand(vocab, -1), torch.arange(vocab)[:, None]], dim=1)  # [V, S+1]
        p2 = target_probs(target(seconds).logits[:, -1], params)  # [V, V]
    joint = p1[:, None] * p2
    return {(a, b): float(joint[a, b]) for a in range(vocab) for b in range(vocab) if joint[a, b] > 0}


@pytest.mark.parametrize("head_kind,setting", [("random", "T=1"), ("bigram", "T=1"), ("random", "T=0.8,top_k=3"),
                                               ("bigram", "T=1.2,top_p=0.7"), ("eagle3", "T=1"), ("gemma2", "T=1")])
def test_eagenerate_first_tokens_match_target_distribution(head_kind, setting):
    params = SETTINGS[setting]
    vocab, draws = 8, 1500
    if head_kind == "bigram":
        target, head = near_bigram_pair(3, vocab_size=vocab, coupling=0.3)
    elif head_kind == "eagle3":  # drafts from 5 of the 8 tokens; the target still samples all 8
        target = tiny_llama(3, vocab_size=vocab)
        head = random_eagle3_head(target, vocab_ids=subset(vocab, 5, 3), seed=4)
    elif head_kind == "gemma2":  # sliding-window and global layers (window 4: the sampled tokens fall beyond it)
        target = family_target("gemma2", 3, coupling=0.05, vocab_size=vocab)
        head = bigram_head(target, 4)
    else:
        target = tiny_llama(3, vocab_size=vocab)
        head = random_head(target, 4)
    model = EaModel(target, head, settings=TreeSettings(total_token=8, depth=3, top_k=3))
    model.eos_ids = set()
    ids = torch.tensor([[3, 5, 1, 6]])
    expected = exact_first_two(target, ids, params)
    torch.manual_seed(1)
    observed: Counter = Counter()
    accepted = 0
    for _ in range(draws):
        out = model.eagenerate(ids, params.temperature, params.top_p, params.top_k, max_new_tokens=2)
        observed[tuple(out[0, -2:].tolist())] += 1
        accepted += model.last_stats.accept_lengths[0] > 1  # the second token was a draft
    if head_kind in ("bigram", "gemma2"):
        assert accepted > 0.3 * draws
    assert chi_square_p_value(observed, expected, draws) > 0.01
