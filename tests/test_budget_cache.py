"""The attention budget's key bounds kept by the runtime's cache (KVCache with a page size): after every write
(prefill chunks, decode steps of several streams, ring wraps that overwrite a page partly) they equal the bounds
recomputed from the rows; stream moves, swaps and resets carry them."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from edgeattn.attention.cached_reference import page_bounds_np
from edgeattn.attention.ring import RingLayout
from edgeattn.errors import ConfigError
from edgeattn.runtime.generation.cache import KVCache

LAYERS, HKV, D = 2, 2, 3


def _check(cache: KVCache, page: int) -> None:
    for layer in range(LAYERS):
        want = page_bounds_np(cache.keys[layer], cache.positions, cache.layout.sinks, page)
        np.testing.assert_array_equal(cache.bounds[layer], want)


def _write(cache, rng, streams, s):
    presents = [rng.standard_normal((len(streams), HKV, s, D)).astype(np.float32) for _ in range(2 * LAYERS)]
    cache.write(presents, streams)


@pytest.mark.parametrize("sinks, wmax, page", [(2, 8, 4), (0, 12, 3), (3, 8, 8), (1, 6, 1)])
def test_bounds_follow_the_rows_through_ring_wraps(sinks, wmax, page):
    rng = np.random.default_rng(sinks + wmax)
    cache = KVCache(layers=LAYERS, kv_heads=HKV, head_dim=D, layout=RingLayout(sinks, wmax), streams=3, page=page)
    _check(cache, page)
    for s in (3, 1, 5, 1, 1, 2, 7, 1, 1, 3, 1, 1, 1, 5, 2, 1):
        _write(cache, rng, [0], min(s, wmax))  # a prefill chunk of one stream, odd lengths: pages overwritten partly
        _check(cache, page)
        _write(cache, rng, [1, 2], 1)  # a decode step of two streams
        _check(cache, page)
    assert cache.positions[0] > sinks + 2 * wmax


def test_moves_swaps_resets_and_copies_carry_the_bounds():
    rng = np.random.default_rng(0)
    cache = KVCache(layers=LAYERS, kv_heads=HKV, head_dim=D, layout=RingLayout(2, 8), streams=3, page=4)
    _write(cache, rng, [0], 6)
    _write(cache, rng, [1], 3)
    cache.swap(0, 1)
    _check(cache, 4)
    cache.move(0, 2)
    _check(cache, 4)
    cache.reset(1)
    _check(cache, 4)
    other = copy.deepcopy(cache)
    _write(other, rng, [2], 1)
    _check(other, 4)
    _check(cache, 4)


def test_a_page_that_does_not_divide_the_ring_is_refused():
    with pytest.raises(ConfigError, match="divisor of the ring's size 8, found 3"):
        KVCache(layers=1, kv_heads=1, head_dim=1, layout=RingLayout(2, 8), page=3)
