"""The oracle for edgeattn::CachedWindowedAttention, the cached form of the op (docs/windowed-attention.md).

Plain and slow on purpose: per batch row it lists the keys a query may read by their stream positions
(`RingLayout.row_positions`), so it shares no index arithmetic with the ONNX body it checks.
"""

from __future__ import annotations

import numpy as np

from edgeattn.attention.ring import RingLayout


def cached_attention_np(q, q_sink, k, v, past_key, past_value, cache_position, window: int, *, sinks: int,
                        scale: float = 0.0, softcap: float = 0.0) -> np.ndarray:
    """float64. q, q_sink: [B, H, S, D] (rotated at t and at min(t, sinks + W)); k, v: [B, H_kv, S, D] (the new
    tokens, rotated at t); past_key/value: [B, H_kv, C, D]; cache_position: [B] tokens already in each stream.
    -> [B, H, S, D]. softcap c > 0: each score s is c * tanh(s / c). The new tokens' rows are not written here:
    that is the runtime's ring write."""
    q, q_sink, k, v, pk, pv = (np.asarray(t, dtype=np.float64) for t in (q, q_sink, k, v, past_key, past_value))
    b, h, s, d = q.shape
    h_kv, c = pk.shape[1], pk.shape[2]
    layout = RingLayout(sinks, c - sinks)
    w = layout.live_window(window)
    scale = scale or 1.0 / np.sqrt(d)
    group = h // h_kv
    out = np.zeros_like(q)
    for bi in range(b):
        n = int(np.asarray(cache_position).reshape(-1)[bi])
        rows = layout.row_positions(n)
        for i in range(s):
            t = n + i
            keys = []  # (query, key vector index source, position)
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
            for head in range(h):
                kv = head // group
                scores, values = [], []
                for kind, src, idx in keys:
                    query = q_sink[bi, head, i] if kind == "sink" else q[bi, head, i]
                    key = pk[bi, kv, idx] if src == "past" else k[bi, kv, idx]
                    val = pv[bi, kv, idx] if src == "past" else v[bi, kv, idx]
                    scores.append(query @ key * scale)
                    values.append(val)
                sc = np.array(scores)
                if softcap:
                    sc = softcap * np.tanh(sc / softcap)
                wts = np.exp(sc - sc.max())
                out[bi, head, i] = (wts / wts.sum()) @ np.array(values)
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
