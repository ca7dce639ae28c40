"""Tree settings: one object, one set of defaults, one command-line binding."""

from __future__ import annotations

import argparse

import pytest

import eagle.decoding.settings as tree_settings
from eagle.decoding.settings import TreeSettings
from eagle.decoding.tree import DEFAULT_CHOICES


def parse(*argv: str, **defaults) -> TreeSettings:
    p = argparse.ArgumentParser()
    tree_settings.add_arguments(p, **defaults)
    return tree_settings.from_arguments(p.parse_args(list(argv)))


def test_the_flags_default_to_the_settings_defaults():
    assert parse() == TreeSettings()
    assert TreeSettings().auto  # the default: the tree timed on this machine


def test_every_flag_reaches_its_field():
    got = parse("--tree", "static", "--total-token", "auto", "--depth", "3", "--draft-top-k", "4",
                "--draft-vocab", "100", "--lookup", "10")
    assert got == TreeSettings(tree="static", total_token="auto", depth=3, top_k=4, draft_vocab=100, lookup=10)
    assert parse("--total-token", "60").total_token == 60


def test_a_tool_may_change_a_default():
    assert parse(total_token="auto").total_token == "auto"


@pytest.mark.parametrize("bad", [dict(total_token="big"), dict(total_token=0), dict(depth=0), dict(top_k=0),
                                 dict(tree="bushy"), dict(lookup=-1), dict(draft_vocab=0)])
def test_bad_values_are_clear_errors(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        TreeSettings(**bad)


def test_auto_and_the_static_tree():
    assert TreeSettings(total_token="auto").auto
    assert not TreeSettings(total_token="auto", tree="static").auto  # a static tree has its size
    assert TreeSettings(tree="static").choices == DEFAULT_CHOICES and TreeSettings().choices is None
    tuned = TreeSettings(total_token="auto", top_k=4).tuned(12, 3)
    assert (tuned.total_token, tuned.depth, tuned.top_k, tuned.auto) == (12, 3, 4, False)
