"""The oracle for edgeattn::WindowedAttention (docs/windowed-attention.md), in plain PyTorch and NumPy.

Dense and slow on purpose: it builds the full [S_q, S_k] mask, so it is obviously right.
"""

from __future__ import annotations

import numpy as np


def allowed_mask_np(s_q: int, s_k: int, window: int, sinks: int, causal: bool) -> np.ndarray:
    """[S_q, S_k] bool: which keys each query row attends (padding not included)."""
    p = np.arange(s_q)[:, None] + (s_k - s_q)  # absolute query positions
    j = np.arange(s_k)[None, :]
    full = window == 0 or window >= s_k
    if causal:
        keep = j <= p
        in_window = (p - j < window) if not full else np.ones_like(keep)
    else:
        keep = np.ones((s_q, s_k), dtype=bool)
        in_window = (np.abs(p - j) < window) if not full else np.ones_like(keep)
    return keep & (in_window | (j < sinks))


def windowed_attention_np(q, k, v, window: int, *, sinks: int = 0, causal: bool = True,
                          scale: float = 0.0, key_padding_mask=None) -> np.ndarray:
    """float64 NumPy reference. q: [B, H, S_q, D]; k, v: [B, H_kv, S_k, D] -> [B, H, S_q, D]."""
    if window < 0:
        raise ValueError(f"window: expected >= 0, found {window}")
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    b, h, s_q, d = q.shape
    h_kv, s_k = k.shape[1], k.shape[2]
    group = h // h_kv
    k = np.repeat(k, group, axis=1)  # k: [B, H, S_k, D]
    v = np.repeat(v, group, axis=1)
    scale = scale or 1.0 / np.sqrt(d)
    allowed = allowed_mask_np(s_q, s_k, window, sinks, causal)[None, None]  # [1, 1, S_q, S_k]
    if key_padding_mask is not None:
        allowed = allowed & np.asarray(key_padding_mask, dtype=bool)[:, None, None, :]
    scores = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    scores = np.where(allowed, scores, -np.inf)
    row_max = np.max(scores, axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    weights = np.exp(scores - row_max) * allowed
    denom = weights.sum(axis=-1, keepdims=True)
    weights = np.divide(weights, denom, out=np.zeros_like(weights), where=denom > 0)  # empty rows -> 0
    return np.einsum("bhqk,bhkd->bhqd", weights, v)


def windowed_attention_torch(q, k, v, window: int, *, sinks: int = 0, causal: bool = True,
                             scale: float = 0.0, key_padding_mask=None):
    """PyTorch reference (float32 softmax), same semantics; runs on any device."""
    import torch

    if int(window) < 0:
        raise ValueError(f"window: expected >= 0, found {int(window)}")
    b, h, s_q, d = q.shape
    h_kv, s_k = k.shape[1], k.shape[2]
    k = k.repeat_interleave(h // h_kv, dim=1)  # k: [B, H, S_k, D]
    v = v.repeat_interleave(h // h_kv, dim=1)
    allowed = torch.from_numpy(allowed_mask_np(s_q, s_k, int(window), sinks, causal)).to(q.device)
    allowed = allowed[None, None]  # [1, 1, S_q, S_k]
    if key_padding_mask is not None:
        allowed = allowed & key_padding_mask.to(torch.bool)[:, None, None, :]
    scores = torch.einsum("bhqd,bhkd->bhqk", q.float(), k.float()) * (scale or d ** -0.5)
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows with no key -> zeros
    return torch.einsum("bhqk,bhkd->bhqd", weights, v.float()).to(q.dtype)
