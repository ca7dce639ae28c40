"""eagle/compiled/cache_views.py: a static cache's row moves and write positions through NumPy views."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from eagle.compiled.cache_views import CacheViews
from eagle.decoding.kv_commit import move_rows


def cache(dtype: torch.dtype, layers: int = 3, device: str = "cpu") -> SimpleNamespace:
    """A StaticCache's shape: layers with keys and values [1, 2, 16, 4] and a 0-d write position each."""
    g = torch.Generator().manual_seed(0)
    return SimpleNamespace(layers=[SimpleNamespace(keys=torch.randn(1, 2, 16, 4, generator=g).to(dtype),
                                                   values=torch.randn(1, 2, 16, 4, generator=g).to(dtype),
                                                   cumulative_length=torch.tensor(0))
                                   for _ in range(layers)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("accepted", [[0, 2], [0, 1, 3, 6], [0, 4, 5], [0]])
def test_moves_equal_torchs_row_moves_in_every_tensor(dtype, accepted):
    ours, theirs = cache(dtype), cache(dtype)
    views = CacheViews.of(ours)
    views.move(5, accepted)
    for layer in theirs.layers:
        move_rows(layer.keys, 5, torch.tensor(accepted))
        move_rows(layer.values, 5, torch.tensor(accepted))
    for a, b in zip(ours.layers, theirs.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_seek_sets_every_layers_write_position():
    c = cache(torch.float32)
    CacheViews.of(c).seek(11)
    assert [int(layer.cumulative_length) for layer in c.layers] == [11, 11, 11]


def test_no_views_before_the_cache_is_allocated():
    c = cache(torch.float32)
    c.layers[1].keys = None  # StaticLayer before its lazy allocation
    assert CacheViews.of(c) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cache_off_the_cpu_moves_and_seeks_through_torchs_ops(dtype):
    """One object, made once, whatever the device: a meta cache gets torch's ops (no NumPy views), and those
    ops move the same rows as the NumPy views (checked on the CPU, forced onto the torch path)."""
    meta = cache(dtype)
    meta.layers[0].values = meta.layers[0].values.to("meta")
    views = CacheViews.of(meta)
    assert views is not None and views.rows is None and views.fits(meta)
    views.move(5, [0, 2])
    views.seek(7)
    assert [int(layer.cumulative_length) for layer in meta.layers] == [7, 7, 7]
    ours, theirs = cache(dtype), cache(dtype)
    forced = CacheViews.of(ours)
    forced.rows = forced.lengths = None
    forced.move(5, [0, 3, 4])
    CacheViews.of(theirs).move(5, [0, 3, 4])
    for a, b in zip(ours.layers, theirs.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_views_know_when_their_cache_was_replaced():
    c = cache(torch.float32)
    views = CacheViews.of(c)
    assert views.fits(c) and not views.fits(cache(torch.float32))
    c.layers[0].keys = c.layers[0].keys.clone()  # reallocated
    assert not views.fits(c)
