"""The oracle for edgeattn::CachedWindowedAttention, the cached form of the op (docs/windowed-attention.md).

Plain and slow on purpose: per batch row it lists the keys a query may read by their stream positions
(`RingLayout.row_positions`), so it shares no index arithmetic with the ONNX body it checks. With an attention
budget (pages > 0) it scores every candidate page of every query and KV head one by one, as the spec reads.
"""

from __future__ import annotations

import numpy as np

from edgeattn.attention.ring import RingLayout


def cached_attention_np(q, q_sink, k, v, past_key, past_value, cache_position, window: int, *, sinks: int,
                        scale: float = 0.0, softcap: float = 0.0, pages: int = 0, page: int = 16,
                        key_bounds=None) -> np.ndarray:
    """float64. q, q_sink: [B, H, S, D] (rotated at t and at min(t, sinks + W)); k, v: [B, H_kv, S, D] (the new
    tokens, rotated at t); past_key/value: [B, H_kv, C, D]; cache_position: [B] tokens already in each stream.
    -> [B, H, S, D]. softcap c > 0: each score s is c * tanh(s / c). The new tokens' rows are not written here:
    that is the runtime's ring write.

    pages k > 0 (docs/windowed-attention.md, "The attention budget"): each query also reads, per KV head, the
    k candidate pages of `page` ring rows whose key bounds score highest; key_bounds [B, H_kv, P, 2, D]
    (None: `page_bounds_np` of the cache). k = 0 is the window alone."""
    q, q_sink, k, v, pk, pv = (np.asarray(t, dtype=np.float64) for t in (q, q_sink, k, v, past_key, past_value))
    b, h, s, d = q.shape
    h_kv, c = pk.shape[1], pk.shape[2]
    layout = RingLayout(sinks, c - sinks)
    w = layout.live_window(window)
    scale = scale or 1.0 / np.sqrt(d)
    group = h // h_kv
    if pages and key_bounds is None:
        key_bounds = page_bounds_np(past_key, cache_position, sinks, page)
    out = np.zeros_like(q)
    for bi in range(b):
        n = int(np.asarray(cache_position).reshape(-1)[bi])
        rows = layout.row_positions(n)
        for i in range(s):
            t = n + i
            keys = []  # (query kind, key source, index)
            for row, p in enumerate(rows):
                if p < 0:
                    continue
                if p < sinks:
                    keys.append(("sink", "past", row))
                elif t - p < w:
                    keys.append(("window", "past", row))
            for j in range(i + 1):
                if i - j < w or n + j < sinks:
                    keys.append(("window", "new", j))
            for kv in range(h_kv):
                heads = range(kv * group, (kv + 1) * group)
                chosen = []
                if pages:
                    chosen = _page_rows(q[bi, heads, i], key_bounds[bi, kv], rows, t, w, layout, pages, page)
                for head in heads:
                    out[bi, head, i] = _attend(q[bi, head, i], q_sink[bi, head, i], keys + chosen, k[bi, kv],
                                               v[bi, kv], pk[bi, kv], pv[bi, kv], scale, softcap)
    return out


def _page_rows(q, bounds, rows, t: int, w: int, layout: RingLayout, pages: int, page: int) -> list:
    """The past rows of the k best candidate pages that are not window rows; a page scores the largest of q . c over
    the group's queries, c the centre of its key bounds (min + max) / 2. q: [G, D] (rotated at t);
    bounds: [P, 2, D]; rows: the stream position each cache row holds (-1 empty)."""
    of = layout.page_of(np.arange(layout.capacity), page)
    old = (rows >= layout.sinks) & (t - rows >= w)  # filled past ring rows older than the window
    candidates = sorted({int(of[row]) for row in np.flatnonzero(old)})
    bounds = np.asarray(bounds, dtype=np.float64)
    centre = {j: bounds[j].sum(axis=0) / 2 for j in candidates}  # the middle of each page's key bounds
    score = {j: max(float(qh @ centre[j]) for qh in q) for j in candidates}
    best = sorted(candidates, key=lambda j: (-score[j], j))[:pages]  # ties: lower page first
    return [("window", "past", int(row)) for row in np.flatnonzero(old & np.isin(of, best))]


def _attend(q, q_sink, keys, k, v, pk, pv, scale: float, softcap: float) -> np.ndarray:
    """One query head over its listed keys: exact softmax attention."""
    scores, values = [], []
    for kind, src, idx in keys:
        query = q_sink if kind == "sink" else q
        key = pk[idx] if src == "past" else k[idx]
        scores.append(query @ key * scale)
        values.append(pv[idx] if src == "past" else v[idx])
    sc = np.array(scores)
    if softcap:
        sc = softcap * np.tanh(sc / softcap)
    wts = np.exp(sc - sc.max())
    return (wts / wts.sum()) @ np.array(values)


def page_bounds_np(past_key, cache_position, sinks: int, page: int) -> np.ndarray:
    """[B, H_kv, P, 2, D] in the cache's dtype: per page of ring rows the elementwise min (index 0) and max
    (index 1) of its filled rows' keys; an empty page holds +inf / -inf. past_key [B, H_kv, C, D]."""
    pk = np.asarray(past_key)
    b, h_kv, c, d = pk.shape
    layout = RingLayout(sinks, c - sinks)
    count = layout.page_count(page)
    out = np.empty((b, h_kv, count, 2, d), dtype=pk.dtype)
    out[:, :, :, 0], out[:, :, :, 1] = np.inf, -np.inf
    for bi in range(b):
        rows = layout.row_positions(int(np.asarray(cache_position).reshape(-1)[bi]))
        for j in range(count):
            filled = sinks + j * page + np.flatnonzero(rows[sinks + j * page: sinks + (j + 1) * page] >= 0)
            if filled.size:
                out[bi, :, j, 0] = pk[bi][:, filled].min(axis=1)
                out[bi, :, j, 1] = pk[bi][:, filled].max(axis=1)
    return out


def write_ring(past_key, past_value, k, v, cache_position, sinks: int) -> None:
    """Write the new tokens' keys and values into their rows, in place (numpy). k, v: [B, H_kv, S, D]."""
    c = past_key.shape[2]
    layout = RingLayout(sinks, c - sinks)
    s = k.shape[2]
    if s > layout.window_max:
        raise ValueError(f"a chunk of {s} tokens is longer than the ring ({layout.window_max} rows)")
    for bi, n in enumerate(np.asarray(cache_position).reshape(-1)):
        rows = layout.slots(np.arange(int(n), int(n) + s))
        past_key[bi, :, rows] = np.swapaxes(k[bi], 0, 1)
        past_value[bi, :, rows] = np.swapaxes(v[bi], 0, 1)
