"""The key bounds of the attention budget's pages, kept on the device: `_page_bounds_kernel` and its launch.

The ring rows [sinks, C) are cut into P = window_max / page pages (ring offset r = row - sinks is in page
r // page). Per stream, KV head and page the bounds hold the elementwise min and max of the page's FILLED rows'
stored keys: bounds [B, H_kv, P, S, D] in the cache dtype (index 0 = min, 1 = max; S = 3: index 2 = min + max,
summed in fp32 from the stored min and max and rounded once: what the selection scores against, kept so that it
reads one vector a page instead of two). Whenever rows are written
the pages they touch are recomputed from their rows, so a page the ring overwrites row by row stays right; rows
not yet filled (offset r >= tokens - sinks before the ring wraps) are left out. Sink rows are in no page.

Two uses, one kernel: the decode write (WRITE: one new row per stream from k, v [B, H_kv, D]; the program stores
it and takes it from registers for the bounds, so no barrier is needed), and a refresh after rows were written
by someone else (a prefill chunk of `count` tokens from `positions`; count >= window_max: every page).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _page_bounds_kernel(
    KN, VN, K, V, Bounds, Pos,
    stride_nb, stride_nh, stride_kb, stride_kh, stride_kn, stride_vn, stride_bb, stride_bh,
    H_kv, count, sinks, wmax, n_pages,
    HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, WRITE: tl.constexpr, SLOTS: tl.constexpr = 2,
):
    # k_cache, v_cache: [B, H_kv, C, D] (same strides but the row's); bounds: [B, H_kv, P, SLOTS, D] (last two dims
    # contiguous); pos: [B] int64, the first position written. WRITE: kn, vn [B, H_kv, D] go to slot(pos) (count 1)
    # grid (pages touched at most, B * H_kv)
    i = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H_kv).to(tl.int64)
    hk = (pid_bh % H_kv).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM)
    p0 = tl.load(Pos + b).to(tl.int32)
    kv_base = b * stride_kb + hk * stride_kh
    v_base = b * stride_kb + hk * stride_kh  # v shares k's batch and head strides (checked on the host)
    new_row = tl.where(p0 < sinks, p0, sinks + (p0 - sinks) % wmax)
    if WRITE:
        kn = tl.load(KN + b * stride_nb + hk * stride_nh + offs_d)  # kn, vn: [D]
        vn = tl.load(VN + b * stride_nb + hk * stride_nh + offs_d)
        if i == 0:
            tl.store(K + kv_base + new_row.to(tl.int64) * stride_kn + offs_d, kn.to(K.dtype.element_ty))
            tl.store(V + v_base + new_row.to(tl.int64) * stride_vn + offs_d, vn.to(V.dtype.element_ty))
    end = p0 + count  # tokens held after the write
    first = tl.maximum(p0, sinks)  # the first ring position written
    r_first = (first - sinks) % wmax
    r_last = (end - 1 - sinks) % wmax
    touched = tl.where(end - first >= wmax, n_pages, (r_last // PAGE - r_first // PAGE + n_pages) % n_pages + 1)
    if (end > first) & (i < touched):
        page = (r_first // PAGE + i) % n_pages
        r = page * PAGE + tl.arange(0, PAGE)  # ring offsets of the page's rows
        filled = r < end - sinks  # before the ring wraps, offsets past the newest token are empty
        rows = (sinks + r).to(tl.int64)
        k = tl.load(K + kv_base + rows[:, None] * stride_kn + offs_d[None, :], mask=filled[:, None], other=0.0)
        if WRITE:
            k = tl.where((rows == new_row)[:, None], kn[None, :].to(k.dtype), k)  # the row stored above
        k = k.to(tl.float32)
        lo = tl.min(tl.where(filled[:, None], k, float("inf")), 0)  # lo, hi: [D]
        hi = tl.max(tl.where(filled[:, None], k, float("-inf")), 0)
        store_bounds(Bounds + b * stride_bb + hk * stride_bh + page.to(tl.int64) * (SLOTS * HEAD_DIM) + offs_d,
                     lo, hi, HEAD_DIM, SLOTS)


@triton.jit
def store_bounds(out, lo, hi, HEAD_DIM: tl.constexpr, SLOTS: tl.constexpr):
    """A page's bounds at out (its slot 0): min, max (fp32 [D], rounded to the bounds' dtype here) and, SLOTS = 3,
    their sum from the rounded values (what _centre_scores sums from two slots)."""
    lo = lo.to(out.dtype.element_ty)
    hi = hi.to(out.dtype.element_ty)
    tl.store(out, lo)
    tl.store(out + HEAD_DIM, hi)
    if SLOTS == 3:
        tl.store(out + 2 * HEAD_DIM, (lo.to(tl.float32) + hi.to(tl.float32)).to(out.dtype.element_ty))


def _check(k_cache, v_cache, bounds, page: int, sinks: int) -> tuple[int, int]:
    b, h_kv, c, d = k_cache.shape
    wmax = c - sinks
    if wmax % page:
        raise ValueError(f"page bounds: expected a page size dividing the ring's {wmax} rows, found {page}")
    n_pages = wmax // page
    slots = bounds.shape[3] if bounds.dim() == 5 else 0
    if (tuple(bounds.shape) != (b, h_kv, n_pages, slots, d) or slots not in (2, 3) or bounds.stride(-1) != 1
            or bounds.stride(-2) != d):
        raise ValueError(f"bounds: expected [B, H_kv, P, 2 or 3, D] = {[b, h_kv, n_pages, '2|3', d]} with its last two "
                         f"dims contiguous, found {list(bounds.shape)} strides {list(bounds.stride())}")
    if (k_cache.stride(0), k_cache.stride(1)) != (v_cache.stride(0), v_cache.stride(1)) or k_cache.stride(-1) != 1:
        raise ValueError("k_cache, v_cache: expected the same batch and head strides and a contiguous last dim")
    return wmax, n_pages


def with_sums(bounds):
    """Bounds of 2 vectors a page [..., 2, D] -> 3 [..., 3, D]: min, max and their sum (fp32, rounded once to the
    bounds' dtype), what the kernels write when the bounds hold 3 (the CUDA engine's cache)."""
    import torch

    return torch.cat([bounds, (bounds[..., :1, :].float() + bounds[..., 1:, :].float()).to(bounds.dtype)], -2)


def ring_write_bounds(k, v, k_cache, v_cache, bounds, positions, *, sinks: int, page: int) -> None:
    """Write each stream's new row (k, v: [B, H_kv, D], at slot(positions[b])) and recompute its page's bounds.
    k_cache, v_cache: [B', H_kv, C, D] (streams 0..B-1 written); bounds: [B', H_kv, P, 2 or 3, D]; in place."""
    b, h_kv, d = k.shape
    k, v = k.contiguous(), v.contiguous()
    wmax, n_pages = _check(k_cache, v_cache, bounds, page, sinks)
    _page_bounds_kernel[(1, b * h_kv)](
        k, v, k_cache, v_cache, bounds, positions,
        k.stride(0), k.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(2),
        bounds.stride(0), bounds.stride(1), h_kv, 1, int(sinks), wmax, n_pages,
        HEAD_DIM=d, PAGE=int(page), WRITE=True, SLOTS=bounds.shape[3], num_warps=1,
    )


def refresh_bounds(k_cache, bounds, positions, count: int, *, sinks: int, page: int) -> None:
    """Recompute the bounds of every page that the `count` rows written from positions[b] touched (streams
    0..len(positions)-1 of k_cache [B', H_kv, C, D] / bounds [B', H_kv, P, 2 or 3, D]); in place."""
    b = positions.shape[0]
    h_kv, d = k_cache.shape[1], k_cache.shape[3]
    wmax, n_pages = _check(k_cache, k_cache, bounds, page, sinks)
    grid = (min(n_pages, -(-int(count) // page) + 1), b * h_kv)
    _page_bounds_kernel[grid](
        k_cache, k_cache, k_cache, k_cache, bounds, positions,
        0, 0, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.stride(2),
        bounds.stride(0), bounds.stride(1), h_kv, int(count), int(sinks), wmax, n_pages,
        HEAD_DIM=d, PAGE=int(page), WRITE=False, SLOTS=bounds.shape[3], num_warps=1,
    )


__all__ = ["refresh_bounds", "ring_write_bounds", "store_bounds", "with_sums"]
