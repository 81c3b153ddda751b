"""The useful work of windowed attention: attended (query, key) pairs, for FLOP and TFLOP/s counts."""

from __future__ import annotations

import numpy as np

from edgeattn.attention.reference import allowed_mask_np

MASK_PAIRS_MAX = 1 << 24  # up to 16M (query, key) pairs: count the reference mask; above: closed form


def attended_pairs(s_q: int, s_k: int, window: int, sinks: int, causal: bool) -> int:
    """Number of (query, key) pairs attended (no padding): the useful work, for FLOP counts.

    Queries are the last s_q of s_k positions; window 0, negative or >= s_k: full.
    """
    if s_q * s_k <= MASK_PAIRS_MAX:
        return int(allowed_mask_np(s_q, s_k, window, sinks, causal).sum())
    p = np.arange(s_q, dtype=np.int64) + (s_k - s_q)  # p: [S_q] query positions
    w = s_k if window <= 0 or window >= s_k else window
    lo = np.maximum(p - w + 1, 0)
    hi = p + 1 if causal else np.minimum(p + w, s_k)
    n = hi - lo + np.minimum(sinks, lo)  # window band + sinks left of it
    if not causal:
        n += np.maximum(np.minimum(sinks, s_k) - hi, 0)  # sinks right of a bidirectional band
    return int(n.sum())


__all__ = ["MASK_PAIRS_MAX", "attended_pairs"]
