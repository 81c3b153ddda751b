"""The attention budget's float64 oracle (cached_attention_np with pages > 0) and the page bounds, against
cases whose answer is known: k = 0 is today's op, enough pages is dense attention over every held row,
a key only a page can reach, ties, and the split of a total budget."""

from __future__ import annotations

import numpy as np
import pytest

from edgeattn.attention.budget import AttentionBudget
from edgeattn.attention.cached_reference import cached_attention_np, page_bounds_np, write_ring
from edgeattn.attention.reference import windowed_attention_np
from edgeattn.attention.ring import RingLayout
from edgeattn.errors import ConfigError

B, H, HKV, D = 2, 4, 2, 8


def _data(rng, t):
    """q, q_sink [B, H, t, D]; k, v [B, H_kv, t, D]: one random stream."""
    return [rng.standard_normal((B, hh, t, D)) for hh in (H, H, HKV, HKV)]


def _stream(rng, sinks, wmax, chunks, data=None):
    """Yield (feeds, pos) chunk by chunk over one random stream, writing the ring after each chunk."""
    q, qs, k, v = data or _data(rng, sum(chunks))
    pk, pv = np.zeros((B, HKV, sinks + wmax, D)), np.zeros((B, HKV, sinks + wmax, D))
    n = 0
    for s in chunks:
        pos = np.full(B, n, np.int64)
        feeds = [q[:, :, n:n + s], qs[:, :, n:n + s], k[:, :, n:n + s], v[:, :, n:n + s], pk, pv]
        yield feeds, pos
        write_ring(pk, pv, feeds[2], feeds[3], pos, sinks)
        n += s


def _dense_over_held(feeds, pos, window, sinks):
    """Every held row: sinks with q_sink, every other past row and the chunk's window keys with q."""
    q, qs, k, v, pk, pv = feeds
    layout = RingLayout(sinks, pk.shape[2] - sinks)
    w = layout.live_window(window)
    out = np.zeros_like(q)
    for bi in range(q.shape[0]):
        rows = layout.row_positions(int(pos[bi]))
        for i in range(q.shape[2]):
            for head in range(H):
                kv = head // (H // HKV)
                keys = [(qs, pk, pv, r) for r in np.flatnonzero((rows >= 0) & (rows < sinks))]
                keys += [(q, pk, pv, r) for r in np.flatnonzero(rows >= sinks)]
                keys += [(q, k, v, j) for j in range(i + 1) if i - j < w or pos[bi] + j < sinks]
                sc = np.array([qq[bi, head, i] @ kk[bi, kv, r] for qq, kk, _, r in keys]) / np.sqrt(D)
                wts = np.exp(sc - sc.max())
                out[bi, head, i] = (wts / wts.sum()) @ np.array([vv[bi, kv, r] for _, _, vv, r in keys])
    return out


@pytest.mark.parametrize("sinks, wmax, window", [(2, 8, 0), (2, 8, 4), (0, 8, 2)])
def test_no_pages_is_todays_op(sinks, wmax, window):
    rng = np.random.default_rng(1)
    chunks = [3, 1, 1, 4, 1, 2, 1, 1, 3, 1, 1, 1]
    for feeds, pos in _stream(rng, sinks, wmax, chunks):
        np.testing.assert_array_equal(
            cached_attention_np(*feeds, pos, window, sinks=sinks, pages=0, page=4),
            cached_attention_np(*feeds, pos, window, sinks=sinks))


@pytest.mark.parametrize("sinks, wmax, window, page", [(2, 8, 2, 2), (0, 12, 3, 4), (4, 8, 1, 1)])
def test_enough_pages_read_every_held_row(sinks, wmax, window, page):
    """Past the ring's end (ring wrap), k >= the candidate pages: dense attention over all filled rows."""
    rng = np.random.default_rng(sinks + wmax)
    chunks = [window] * 3 + [1] * (2 * wmax)  # chunks no longer than the window: every new key is a window key
    for feeds, pos in _stream(rng, sinks, wmax, chunks):
        got = cached_attention_np(*feeds, pos, window, sinks=sinks, pages=wmax // page, page=page)
        np.testing.assert_allclose(got, _dense_over_held(feeds, pos, window, sinks), atol=1e-12)


def test_a_stream_that_fits_is_full_attention():
    """No position passes sinks + W_max, so the sink rotation is the true one (q_sink = q)."""
    sinks, wmax, window, chunks = 2, 16, 4, [4, 4, 1, 1, 1, 3, 1, 1]
    q, _, k, v = _data(np.random.default_rng(7), sum(chunks))
    outs = [cached_attention_np(*feeds, pos, window, sinks=sinks, pages=4, page=4)
            for feeds, pos in _stream(None, sinks, wmax, chunks, data=[q, q, k, v])]
    np.testing.assert_allclose(np.concatenate(outs, axis=2), windowed_attention_np(q, k, v, 0, sinks=sinks),
                               atol=1e-12)


def _one_key_far_back(pages: int) -> tuple[np.ndarray, np.ndarray]:
    """One stream, D = 4, sinks 1, ring 16, pages of 4, window 4, at position 17: the key that matches the
    query sits at position 3 (page 0), its value is 1s; every other key is orthogonal to the query."""
    sinks, wmax, d, n = 1, 16, 4, 17
    pk, pv = np.zeros((1, 1, sinks + wmax, d)), np.zeros((1, 1, sinks + wmax, d))
    pk[0, 0, :, 1] = 1.0  # orthogonal to the query
    layout = RingLayout(sinks, wmax)
    row = int(layout.slots(np.array(3)))
    pk[0, 0, row] = [12.0, 0, 0, 0]
    pv[0, 0, row] = 1.0
    q = np.array([1.0, 0, 0, 0]).reshape(1, 1, 1, d)
    k, v = np.zeros((1, 1, 1, d)), np.zeros((1, 1, 1, d))
    out = cached_attention_np(q, q, k, v, pk, pv, np.array([n]), 4, sinks=sinks, pages=pages, page=4)
    return out[0, 0, 0], page_bounds_np(pk, np.array([n]), sinks, 4)


def test_a_page_brings_back_a_key_the_window_missed():
    alone, _ = _one_key_far_back(0)
    found, bounds = _one_key_far_back(1)
    assert alone[0] == 0.0  # the window reads no value of 1s
    assert found[0] > 0.9  # the one page chosen holds it
    assert bounds[0, 0, 0, 1, 0] == 12.0 and bounds[0, 0, 1, 1, 0] == 0.0


def test_ties_choose_the_lower_page():
    """Pages 0 and 1 hold the same keys; values say which page was read."""
    sinks, wmax, page, n = 0, 12, 4, 12
    pk = np.zeros((1, 1, wmax, 2))
    pk[0, 0, :, 0] = np.tile([1.0, 0.5, 0.25, 0.0], 3)
    pv = np.zeros_like(pk)
    pv[0, 0, 0:4, 0], pv[0, 0, 4:8, 1] = 1.0, 1.0
    q = np.array([1.0, 0]).reshape(1, 1, 1, 2)
    zero = np.zeros((1, 1, 1, 2))
    out = cached_attention_np(q, q, zero, zero, pk, pv, np.array([n]), 4, sinks=sinks, pages=1, page=page)[0, 0, 0]
    assert out[0] > 0 and out[1] == 0.0


def test_bounds_cover_filled_rows_only():
    rng = np.random.default_rng(5)
    sinks, wmax, page = 2, 8, 4
    pk = rng.standard_normal((1, 1, sinks + wmax, 3))
    bounds = page_bounds_np(pk, np.array([7]), sinks, page)  # ring offsets 0..4 filled: page 0 whole, page 1 one row
    np.testing.assert_array_equal(bounds[0, 0, 0, 0], pk[0, 0, 2:6].min(axis=0))
    np.testing.assert_array_equal(bounds[0, 0, 1, 1], pk[0, 0, 6])
    empty = page_bounds_np(pk, np.array([2]), sinks, page)
    assert np.all(empty[..., 0, :] == np.inf) and np.all(empty[..., 1, :] == -np.inf)
    with pytest.raises(ConfigError, match="divisor of the ring's size 8, found 3"):
        page_bounds_np(pk, np.array([7]), sinks, 3)


def test_budget_split_and_page_geometry():
    layout = RingLayout(4, 256)
    budget = AttentionBudget.from_total(layout, 132)
    assert (budget.window, budget.pages, budget.page) == (32, 6, 16) and budget.rows == 132
    assert AttentionBudget.from_total(layout, 20).pages == 0
    for bad in (19, 261, 100.0):
        with pytest.raises(ConfigError, match="found"):
            AttentionBudget.from_total(layout, bad)
    np.testing.assert_array_equal(layout.page_of(np.array([0, 3, 4, 19, 20, 259]), 16), [-1, -1, 0, 0, 1, 15])
    assert layout.page_count(16) == 16
