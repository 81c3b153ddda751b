"""Decode with the attention budget over a sinks + ring cache: page selection on the device, then a block-sparse
split-K attention over the sinks, the recent window and the chosen pages (Quest, arXiv 2406.10774).

One new token per stream at position t = positions[b] (the tokens cached before it); the cache holds the rows as
they were BEFORE this token (the new key and value come as k, v [B, H_kv, D] and are written afterwards by
budget_bounds.ring_write_bounds), so every past row the budget may choose is still there, the row the new token
will overwrite (position t - window_max) included.

1. `_budget_select_kernel`, one program per (stream, KV head): every candidate page (a page with a filled past
   row at distance t - p >= W) is scored max over the group's query heads h of sum_d max(q[h,d] * lo[d],
   q[h,d] * hi[d]) (q rotated at t, no scale), and the k = min(pages, K_MAX) best are listed (ties: the lower
   page first; fewer candidates: all of them; the rest of the list is -1). k is a device scalar, like the
   window, so a CUDA graph replays any k up to K_MAX.
2. `_budget_decode_split_kernel`, grid (SPLITS, B * H_kv): exact online softmax over the sink rows (q_sink),
   the window rows and the new token (q), and the chosen pages' filled rows that are not window rows (q), split
   across SPLITS programs and merged by decode.py's reduce kernel. Page rows are gathered BLOCK_N at a time
   (BLOCK_N / page pages a tile).
Reads top to bottom: the selection, the attention, the launch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgeattn.plugins.kernels.cached_decode import INTERPRETER_SMS, cached_decode_splits
from edgeattn.plugins.kernels.common import LOG2E, NEG_BIG
from edgeattn.plugins.kernels.decode import _windowed_decode_reduce_kernel
from edgeattn.plugins.kernels.launch import last_dim_contiguous
from edgeattn.plugins.kernels.tuning import DECODE_BLOCK_N

FLOOR_KEY = tl.constexpr(-2139095041)  # 0x807FFFFF as int32: the sortable key of -inf, below every finite score's key


@triton.jit
def _held_positions(r, t, sinks, wmax):
    """Stream positions held by ring offsets r before the token at t is written, -1 where empty
    (RingLayout.row_positions(t) of the ring rows)."""
    last = t - 1 - sinks  # ring offset of the newest cached token (< 0: none)
    held = last - ((last - r) % wmax + wmax) % wmax
    return tl.where((last >= 0) & (held >= 0), held + sinks, -1)


@triton.jit
def _top_keys(key, P_POW2: tl.constexpr, K_MAX: tl.constexpr, HAS_TOPK: tl.constexpr):
    """The K_MAX largest of key [P_POW2] (int64), largest first."""
    if K_MAX == P_POW2:
        return tl.sort(key, descending=True)
    elif HAS_TOPK:
        return tl.topk(key, K_MAX)
    else:  # sorted descending, row 0 of [P_POW2 / K_MAX, K_MAX] holds the largest: the column maxima
        return tl.max(tl.reshape(tl.sort(key, descending=True), [P_POW2 // K_MAX, K_MAX]), 0)


@triton.jit
def _budget_select_kernel(
    Q, Bounds, Pos, Window, Pages, Sel,
    stride_qb, stride_qh, stride_bb, stride_bh,
    H_kv, GROUP, sinks, wmax, n_pages,
    HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr,
    P_POW2: tl.constexpr, K_TOP: tl.constexpr, K_MAX: tl.constexpr, HAS_TOPK: tl.constexpr,
):
    # q: [B, H, D] rotated at t; bounds: [B, H_kv, P, 2, D]; pos: [B] int64; window, pages: [] int64
    # sel: [B * H_kv, K_MAX] int32 out (K_TOP = min(K_MAX, P_POW2) entries can be pages); grid (B * H_kv,)
    pid = tl.program_id(0)
    b = (pid // H_kv).to(tl.int64)
    hk = (pid % H_kv).to(tl.int64)
    w = tl.load(Window).to(tl.int32)
    w = tl.where((w <= 0) | (w > wmax), wmax, w)
    t = tl.load(Pos + b).to(tl.int32)
    # candidates: pages holding a position in [max(sinks, t - wmax), t - W] (the ring before the new token)
    lo_p = tl.maximum(sinks, t - wmax)
    span = t - w - lo_p + 1  # positions in that range (<= 0: none)
    r_lo = (tl.maximum(lo_p - sinks, 0)) % wmax
    n_cand = tl.where(span > 0, tl.minimum(n_pages, (r_lo % PAGE + span - 1) // PAGE + 1), 0)
    first = r_lo // PAGE
    # score = max over the group's heads of q+ . hi + q- . lo (= sum_d max(q * lo, q * hi)): two small products
    r = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * stride_qb + (hk * GROUP + r)[:, None] * stride_qh + offs_d[None, :],
                mask=(r < GROUP)[:, None], other=0.0).to(Bounds.dtype.element_ty)  # q: [BLOCK_M, D]
    q_pos = tl.maximum(q, 0.0).to(Bounds.dtype.element_ty)
    q_neg = tl.minimum(q, 0.0).to(Bounds.dtype.element_ty)
    b_base = b * stride_bb + hk * stride_bh
    keys = tl.zeros([P_POW2 // BLOCK_P, BLOCK_P], tl.int64)
    blocks = tl.arange(0, P_POW2 // BLOCK_P)
    for i in tl.static_range(P_POW2 // BLOCK_P):
        page = i * BLOCK_P + tl.arange(0, BLOCK_P)
        cand = ((page - first + n_pages) % n_pages < n_cand) & (page < n_pages)
        b_off = b_base + page.to(tl.int64)[:, None] * (2 * HEAD_DIM) + offs_d[None, :]
        lo = tl.load(Bounds + b_off, mask=cand[:, None], other=0.0)  # lo, hi: [BLOCK_P, D]
        hi = tl.load(Bounds + b_off + HEAD_DIM, mask=cand[:, None], other=0.0)
        if Bounds.dtype.element_ty == tl.float32:
            s = tl.dot(q_pos, tl.trans(hi), input_precision="ieee") + tl.dot(q_neg, tl.trans(lo), input_precision="ieee")
        else:
            s = tl.dot(q_pos, tl.trans(hi)) + tl.dot(q_neg, tl.trans(lo))  # s: [BLOCK_M, BLOCK_P] fp32
        s = tl.max(tl.where((r < GROUP)[:, None], s, float("-inf")), 0)
        s = tl.where(cand, s, float("-inf"))
        bits = s.to(tl.int32, bitcast=True)
        key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # float order as signed int order
        key = (key.to(tl.int64) << 32) | (P_POW2 - 1 - page).to(tl.int64)  # ties: the lower page is larger
        keys = tl.where((blocks == i)[:, None], key[None, :], keys)
    top = _top_keys(tl.reshape(keys, [P_POW2]), P_POW2, K_TOP, HAS_TOPK)  # [K_TOP], best first
    chosen = P_POW2 - 1 - (top & 0xFFFFFFFF).to(tl.int32)
    k = tl.minimum(tl.minimum(tl.maximum(tl.load(Pages).to(tl.int32), 0), K_TOP), n_cand)
    j = tl.arange(0, K_TOP)
    tl.store(Sel + pid.to(tl.int64) * K_MAX + j, tl.where(j < k, chosen, -1))
    if K_MAX > K_TOP:  # a list longer than the ring's pages (a short ring): the rest is empty
        j = tl.arange(0, K_MAX)
        tl.store(Sel + pid.to(tl.int64) * K_MAX + j, tl.full([K_MAX], -1, tl.int32), mask=j >= K_TOP)


@triton.jit
def _budget_blocks(acc, l_i, m_i, q, K, V, sel, kv_base, stride_kn, stride_vn, offs_d, kn, vn,
                   u0, u1, count, first_pos, t, w, sinks, wmax, qk_scale,
                   MODE: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, K_MAX: tl.constexpr):
    """Online softmax over virtual keys [u0, u1) of one group. MODE 0: sink rows u; 1: window positions
    first_pos + u, the last one (u = count - 1) the new token from kn, vn; 2: the rows of the chosen pages
    (sel: [K_MAX // (BLOCK_N / PAGE), BLOCK_N / PAGE], the pages of each block), those filled and outside the
    window."""
    for start in range(u0, u1, BLOCK_N):
        u = start + tl.arange(0, BLOCK_N)
        live = u < count
        if MODE == 0:
            rows = u
        elif MODE == 1:
            p = first_pos + u
            rows = tl.where(p < sinks, p, sinks + (p - sinks) % wmax)
        else:
            blk = tl.arange(0, K_MAX * PAGE // BLOCK_N)
            pages = tl.sum(tl.where((blk == start // BLOCK_N)[:, None], sel, 0), 0)  # this block's pages
            r = tl.reshape(pages[:, None] * PAGE + tl.arange(0, PAGE)[None, :], [BLOCK_N])
            page = tl.reshape(pages[:, None] + tl.zeros([BLOCK_N // PAGE, PAGE], tl.int32), [BLOCK_N])
            p = _held_positions(r, t, sinks, wmax)
            live = live & (page >= 0) & (p >= 0) & (t - p >= w)
            rows = sinks + r
        rows = tl.where(live, rows, 0).to(tl.int64)
        k = tl.load(K + kv_base + rows[:, None] * stride_kn + offs_d[None, :], mask=live[:, None], other=0.0)
        if MODE == 1:
            new = (u == count - 1)[:, None]
            k = tl.where(new, kn[None, :], k)
        qk = tl.dot(q, tl.trans(k)) * qk_scale  # qk: [BLOCK_M, BLOCK_N], log2 domain
        qk = tl.where(live[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p_w = tl.math.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p_w, 1)
        v = tl.load(V + kv_base + rows[:, None] * stride_vn + offs_d[None, :], mask=live[:, None], other=0.0)
        if MODE == 1:
            v = tl.where(new, vn[None, :], v)
        acc = acc * alpha[:, None] + tl.dot(p_w.to(v.dtype), v)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _budget_decode_split_kernel(
    Q, QS, KN, VN, K, V, Pos, Window, Sel,
    stride_qb, stride_qh, stride_nb, stride_nh, stride_kb, stride_kh, stride_kn, stride_vn,
    H_kv, GROUP, C, sinks, sm_scale,
    PartO, PartM, PartL, Out, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr,
    K_MAX: tl.constexpr, SPLITS: tl.constexpr,
):
    # q, q_sink: [B, H, 1, D]; kn, vn: [B, H_kv, D] (the new token, not yet in the cache); k, v: [B, H_kv, C, D]
    # pos: [B] int64; window: [] int64; sel: [B * H_kv, K_MAX] int32 (chosen pages first, then -1)
    # part_o: [B*H_kv, SPLITS, BLOCK_M, D] fp32; part_m, part_l: [B*H_kv, SPLITS, BLOCK_M]; grid (SPLITS, B*H_kv)
    split = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H_kv).to(tl.int64)
    hk = (pid_bh % H_kv).to(tl.int64)
    wmax = C - sinks
    w = tl.load(Window).to(tl.int32)
    w = tl.where((w <= 0) | (w > wmax), wmax, w)
    t = tl.load(Pos + b).to(tl.int32)
    n_sink = tl.minimum(sinks, t)
    first_pos = tl.maximum(t + 1 - w, n_sink)  # window: positions [first_pos, t], t the new token
    n_ring = t + 1 - first_pos
    sel = tl.load(Sel + pid_bh.to(tl.int64) * K_MAX + tl.arange(0, K_MAX))  # sel: [K_MAX] chosen pages, then -1
    n_page = tl.sum((sel >= 0).to(tl.int32), 0) * PAGE
    sel = tl.reshape(sel, [K_MAX * PAGE // BLOCK_N, BLOCK_N // PAGE])  # the pages of each block of BLOCK_N rows
    qk_scale = sm_scale * LOG2E

    r = tl.arange(0, BLOCK_M)  # row = head in group
    valid = r < GROUP
    head = hk * GROUP + r
    offs_d = tl.arange(0, HEAD_DIM)
    q_off = b * stride_qb + head[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(Q + q_off, mask=valid[:, None], other=0.0)  # q: [BLOCK_M, D]
    qs = tl.load(QS + q_off, mask=valid[:, None], other=0.0)
    kn = tl.load(KN + b * stride_nb + hk * stride_nh + offs_d)  # kn, vn: [D]
    vn = tl.load(VN + b * stride_nb + hk * stride_nh + offs_d)

    # blocks: sinks, window, pages; this split takes [t0, t1)
    nsb = tl.cdiv(n_sink, BLOCK_N)
    nwb = tl.cdiv(n_ring, BLOCK_N)
    total = nsb + nwb + tl.cdiv(n_page, BLOCK_N)
    per = tl.cdiv(total, SPLITS)
    t0 = tl.minimum(split * per, total)
    t1 = tl.minimum(t0 + per, total)
    kv_base = b * stride_kb + hk * stride_kh
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + NEG_BIG
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    acc, l_i, m_i = _budget_blocks(acc, l_i, m_i, qs, K, V, sel, kv_base, stride_kn, stride_vn, offs_d,
                                   kn, vn, tl.minimum(t0, nsb) * BLOCK_N, tl.minimum(t1, nsb) * BLOCK_N, n_sink, 0,
                                   t, w, sinks, wmax, qk_scale, 0, PAGE, BLOCK_N, K_MAX)
    lo, hi = tl.minimum(tl.maximum(t0, nsb), nsb + nwb) - nsb, tl.minimum(tl.maximum(t1, nsb), nsb + nwb) - nsb
    acc, l_i, m_i = _budget_blocks(acc, l_i, m_i, q, K, V, sel, kv_base, stride_kn, stride_vn, offs_d,
                                   kn, vn, lo * BLOCK_N, hi * BLOCK_N, n_ring, first_pos,
                                   t, w, sinks, wmax, qk_scale, 1, PAGE, BLOCK_N, K_MAX)
    lo, hi = tl.maximum(t0, nsb + nwb) - nsb - nwb, tl.maximum(t1, nsb + nwb) - nsb - nwb
    acc, l_i, m_i = _budget_blocks(acc, l_i, m_i, q, K, V, sel, kv_base, stride_kn, stride_vn, offs_d,
                                   kn, vn, lo * BLOCK_N, hi * BLOCK_N, n_page, 0,
                                   t, w, sinks, wmax, qk_scale, 2, PAGE, BLOCK_N, K_MAX)
    if SPLITS == 1:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(Out + b * stride_ob + head[:, None] * stride_oh + offs_d[None, :], out.to(Out.dtype.element_ty),
                 mask=valid[:, None])
    else:
        part = (pid_bh.to(tl.int64) * SPLITS + split) * BLOCK_M
        tl.store(PartO + (part + r[:, None]) * HEAD_DIM + offs_d[None, :], acc)
        tl.store(PartM + part + r, m_i)
        tl.store(PartL + part + r, l_i)


def k_max_for(pages: int) -> int:
    """The k_max a graph is captured for, serving every run-time k up to `pages`: a power of two >= pages."""
    return 1 << max(int(pages) - 1, 0).bit_length()


def selection_length(k_max: int, page: int) -> int:
    """Entries of the selection list: k_max as a power of two, at least one block of DECODE_BLOCK_N rows."""
    if page > DECODE_BLOCK_N or DECODE_BLOCK_N % page:
        raise ValueError(f"page: expected a power of two up to {DECODE_BLOCK_N} rows (the kernel's block), found {page}")
    return max(k_max_for(k_max), DECODE_BLOCK_N // page)


HAS_TOPK = hasattr(tl, "topk")  # Triton >= 3.5: a bitonic top-k; before, a full sort


def budget_splits(batch_kv_heads: int, sinks: int, window_keys: int, k_max: int, page: int, sms: int) -> int:
    """Splits per kv head from the rows the budget reads at most (sinks + W + K_MAX * page)."""
    return cached_decode_splits(batch_kv_heads, sinks, window_keys + k_max * page, sms)


def select_pages(q, bounds, positions, window, pages, *, sinks: int, page: int, k_max: int):
    """The chosen pages of every (stream, kv head): int32 [B * H_kv, K_MAX], best first, -1 past the k-th.
    q: [B, H, D] rotated at t; bounds: [B', H_kv, P, 2, D]; pages: [] int64 (clamped to K_MAX)."""
    import torch

    q = last_dim_contiguous(q)
    b, h, d = q.shape
    h_kv, n_pages = bounds.shape[1], bounds.shape[2]
    p_pow2 = max(16, triton.next_power_of_2(n_pages))
    k_max = selection_length(k_max, page)
    sel = torch.empty((b * h_kv, k_max), device=q.device, dtype=torch.int32)
    _budget_select_kernel[(b * h_kv,)](
        q, bounds, positions, window, pages, sel,
        q.stride(0), q.stride(1), bounds.stride(0), bounds.stride(1),
        h_kv, h // h_kv, int(sinks), n_pages * page, n_pages,
        HEAD_DIM=d, PAGE=int(page), BLOCK_M=max(16, triton.next_power_of_2(h // h_kv)), BLOCK_P=min(p_pow2, 128),
        P_POW2=p_pow2, K_TOP=min(k_max, p_pow2), K_MAX=k_max, HAS_TOPK=HAS_TOPK, num_warps=4,
    )
    return sel


def budget_decode(q, q_sink, k, v, k_cache, v_cache, bounds, positions, window, pages, *, sinks: int,
                  page: int, k_max: int, scale: float = 0.0, window_keys: int | None = None,
                  splits: int | None = None):
    """Attention of one new token per stream under the budget, the cache read as it was before the token.
    q, q_sink: [B, H, D]; k, v: [B, H_kv, D] (the new token); k_cache, v_cache: [B', H_kv, C, D]; bounds:
    [B', H_kv, P, 2, D]; positions: [B] int64; window, pages: [] int64 on the device; k_max: the largest k this
    launch serves. Returns [B, H, D]. Writes nothing (budget_bounds.ring_write_bounds does, afterwards)."""
    import torch

    q, q_sink, k, v = (last_dim_contiguous(t) for t in (q, q_sink, k, v))
    b, h, d = q.shape
    h_kv, c = k_cache.shape[1], k_cache.shape[2]
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache, v_cache: expected a contiguous last dim")
    group = h // h_kv
    sel = select_pages(q, bounds, positions, window, pages, sinks=sinks, page=page, k_max=k_max)
    k_max = sel.shape[1]
    block_m = max(16, triton.next_power_of_2(group))
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else INTERPRETER_SMS
    keys = c - sinks if window_keys is None else window_keys
    n_split = splits or budget_splits(b * h_kv, sinks, keys, k_max, page, sms)
    parts = (b * h_kv, n_split, block_m) if n_split > 1 else (1, 1, 1)
    part_o = torch.empty((*parts, d), device=q.device, dtype=torch.float32)
    part_m = torch.empty(parts, device=q.device, dtype=torch.float32)
    part_l = torch.empty_like(part_m)
    out = torch.empty((b, h, 1, d), device=q.device, dtype=q.dtype)
    _budget_decode_split_kernel[(n_split, b * h_kv)](
        q, q_sink, k, v, k_cache, v_cache, positions, window, sel,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), v_cache.stride(2), h_kv, group, c, int(sinks), float(scale or d ** -0.5),
        part_o, part_m, part_l, out, out.stride(0), out.stride(1),
        HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=DECODE_BLOCK_N, PAGE=int(page), K_MAX=k_max, SPLITS=n_split,
        num_warps=4, num_stages=2,
    )
    if n_split > 1:
        _windowed_decode_reduce_kernel[(b * h_kv, group)](
            part_o, part_m, part_l, out.stride(0), out.stride(1), out.stride(2), h_kv, group, 1, out,
            HEAD_DIM=d, BLOCK_M=block_m, SPLITS=n_split, num_warps=4,
        )
    return out[:, :, 0]


__all__ = ["HAS_TOPK", "budget_decode", "budget_splits", "k_max_for", "select_pages", "selection_length"]
