"""Decode with the attention budget over a sinks + ring cache: page selection on the device, then a block-sparse
split-K attention over the sinks, the recent window and the chosen pages (Quest, arXiv 2406.10774).

One new token per stream at position t = positions[b] (the tokens cached before it); the cache holds the rows as
they were BEFORE this token (the new key and value come as k, v [B, H_kv, D]), so every past row the budget may
choose is still there, the row the new token will overwrite (position t - window_max) included.

The CUDA path (v2), two launches a layer:
1. `_budget_score_kernel`, grid (P / BLOCK_P, B * H_kv): every candidate page (a page with a filled past row at
   distance t - p >= W) is scored max over the group's query heads h of sum_d max(q[h,d] * lo[d], q[h,d] * hi[d])
   (q rotated at t, no scale; in one product with lo + hi, a vector the bounds keep as their third, or summed from
   the first two) into int32 keys that sort as the scores; the last program of a (stream, KV head)
   (a counter) lists the k = min(pages, K_MAX) best in page order (`_choose_pages`: the k-th largest key by top-k,
   ties to the lower page; fewer candidates: all of them; the rest of the list is -1). k is a device scalar, like
   the window, so a CUDA graph replays any k up to K_MAX.
2. `_budget_attend_kernel`, grid (SPLITS, B * H_kv): exact online softmax over the sink rows (q_sink), the window
   rows and the new token (q), and the chosen pages' filled rows that are not window rows (q); each split takes a
   share of the sink + window blocks and a share of the page blocks, the last split of a (stream, KV head) merges
   the partials and (write=True) writes the new row and its page's bounds (what budget_bounds.ring_write_bounds
   does) once every read of the row it overwrites is done. On Hopper it is a programmatic dependent of the
   selection: it reads the sinks and the window while the pages are chosen.
The first path (`_budget_select_kernel`: one program per (stream, KV head), the list best first;
`_budget_decode_split_kernel`, decode.py's reduce kernel, then ring_write_bounds) is kept for the AOT builds and
for comparison (EDGEATTN_BUDGET_V1=1, legacy=True); both choose the same set of pages.
Reads top to bottom: the first path's kernels, v2's, the launch.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from edgeattn.plugins.kernels.cached_decode import INTERPRETER_SMS, PROGRAMS_PER_SM, cached_decode_splits
from edgeattn.plugins.kernels.budget_bounds import store_bounds
from edgeattn.plugins.kernels.common import LOG2E, NEG_BIG, decode_step, load_rows
from edgeattn.plugins.kernels.decode import _windowed_decode_reduce_kernel, merge_splits
from edgeattn.plugins.kernels.launch import last_dim_contiguous
from edgeattn.plugins.kernels.tuning import DECODE_BLOCK_N, decode_splits

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
def _page_sums(Bounds, b_off, cand, HEAD_DIM: tl.constexpr, SLOTS: tl.constexpr):
    """lo + hi [BLOCK_P, D] of the pages at b_off (their slot-0 offsets + the dims; non-candidates 0): the stored
    sum (SLOTS = 3: one vector a page read) or summed here in fp32 from min and max and rounded once to the bounds'
    dtype (SLOTS = 2), as the reference op does (cached_torch): the same values either way."""
    if SLOTS == 3:
        return tl.load(Bounds + b_off + 2 * HEAD_DIM, mask=cand[:, None], other=0.0)
    lo = tl.load(Bounds + b_off, mask=cand[:, None], other=0.0)
    hi = tl.load(Bounds + b_off + HEAD_DIM, mask=cand[:, None], other=0.0)
    return (lo.to(tl.float32) + hi.to(tl.float32)).to(lo.dtype)


@triton.jit
def _centre_scores(q, both, IEEE: tl.constexpr):
    """q [BLOCK_M, D] . (lo + hi) [BLOCK_P, D] -> [BLOCK_M, BLOCK_P] fp32: twice each page's score against the centre
    of its key bounds, in one product (two products, q . lo + q . hi, slowed the attention launch that follows by
    ~7% at batch 64 on the H200)."""
    if IEEE:
        return tl.dot(q, tl.trans(both), input_precision="ieee")
    return tl.dot(q, tl.trans(both))


@triton.jit
def _budget_select_kernel(
    Q, Bounds, Pos, Window, Pages, Sel,
    stride_qb, stride_qh, stride_bb, stride_bh,
    H_kv, GROUP, sinks, wmax, n_pages,
    HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr,
    P_POW2: tl.constexpr, K_TOP: tl.constexpr, K_MAX: tl.constexpr, HAS_TOPK: tl.constexpr, SLOTS: tl.constexpr = 2,
):
    # q: [B, H, D] rotated at t; bounds: [B, H_kv, P, SLOTS, D]; pos: [B] int64; window, pages: [] int64
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
    # score = max over the group's heads of q . (lo + hi) (twice q . the centre of the key bounds)
    r = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * stride_qb + (hk * GROUP + r)[:, None] * stride_qh + offs_d[None, :],
                mask=(r < GROUP)[:, None], other=0.0).to(Bounds.dtype.element_ty)  # q: [BLOCK_M, D]
    b_base = b * stride_bb + hk * stride_bh
    keys = tl.zeros([P_POW2 // BLOCK_P, BLOCK_P], tl.int64)
    blocks = tl.arange(0, P_POW2 // BLOCK_P)
    for i in tl.static_range(P_POW2 // BLOCK_P):
        page = i * BLOCK_P + tl.arange(0, BLOCK_P)
        cand = ((page - first + n_pages) % n_pages < n_cand) & (page < n_pages)
        b_off = b_base + page.to(tl.int64)[:, None] * (SLOTS * HEAD_DIM) + offs_d[None, :]
        both = _page_sums(Bounds, b_off, cand, HEAD_DIM, SLOTS)  # [BLOCK_P, D]
        s = _centre_scores(q, both, Bounds.dtype.element_ty == tl.float32)  # s: [BLOCK_M, BLOCK_P] fp32
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
        k = load_rows(K, kv_base, rows, live, offs_d, stride_kn)
        v = load_rows(V, kv_base, rows, live, offs_d, stride_vn)
        if MODE == 1:  # the new token, not yet in the cache
            new = (u == count - 1)[:, None]
            k = tl.where(new, kn[None, :], k)
            v = tl.where(new, vn[None, :], v)
        acc, l_i, m_i = decode_step(acc, l_i, m_i, q, k, v, live, qk_scale)
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


# --- the selection and the attention of the CUDA path (v2): more programs for the scores, the row write folded in ----
NO_KEY = tl.constexpr(-2147483648)  # int32 min: below every score's sortable key (non-candidate pages)


@triton.jit
def _choose_pages(key, k, Sel, pid, P_POW2: tl.constexpr, K_TOP: tl.constexpr, K_MAX: tl.constexpr,
                  HAS_TOPK: tl.constexpr):
    """Store the k (<= the candidates, <= K_TOP) largest of key [P_POW2] (int32, page order; ties: the lower page)
    as sel[pid, :k] in page order, -1 after: the k-th largest key by top-k, then the pages above it and the first
    pages equal to it (a prefix sum), compacted by a second prefix sum."""
    top = _top_keys(key, P_POW2, K_TOP, HAS_TOPK)  # [K_TOP] int32, largest first
    j = tl.arange(0, K_TOP)
    thr = tl.max(tl.where(j == k - 1, top, NO_KEY), 0)  # the k-th largest key (k >= 1)
    above = key > thr
    tie = key == thr
    need = k - tl.sum(above.to(tl.int32), 0)
    chosen = above | (tie & (tl.cumsum(tie.to(tl.int32), 0) <= need))
    chosen = chosen & (tl.zeros([P_POW2], tl.int32) + k > 0)  # k = 0: none (a tensor: the interpreter wants one)
    at = tl.cumsum(chosen.to(tl.int32), 0) - 1
    base = Sel + pid.to(tl.int64) * K_MAX
    tl.store(base + at, tl.arange(0, P_POW2), mask=chosen)
    jj = tl.arange(0, K_MAX)
    tl.store(base + jj, tl.full([K_MAX], -1, tl.int32), mask=jj >= k)


@triton.jit
def _budget_score_kernel(
    Q, Bounds, Pos, Window, Pages, Keys, Sel, Counter,
    stride_qb, stride_qh, stride_bb, stride_bh,
    H_kv, GROUP, sinks, wmax, n_pages,
    HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr,
    P_POW2: tl.constexpr, K_TOP: tl.constexpr, K_MAX: tl.constexpr, HAS_TOPK: tl.constexpr,
    USE_PDL: tl.constexpr = False, SLOTS: tl.constexpr = 2,
):
    # as _budget_select_kernel, spread: grid (P_POW2 // BLOCK_P, B * H_kv); program i scores pages
    # [i * BLOCK_P, (i + 1) * BLOCK_P) into keys [B * H_kv, P_POW2] int32; the last program of a (stream, kv head)
    # to finish (counter: [>= B * H_kv] int32 zeros, left zeros) chooses from all of them. USE_PDL: let the
    # attention launch (a programmatic dependent) start at once: it reads the sinks and the window meanwhile
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
    i = tl.program_id(0)
    pid = tl.program_id(1)
    b = (pid // H_kv).to(tl.int64)
    hk = (pid % H_kv).to(tl.int64)
    w = tl.load(Window).to(tl.int32)
    w = tl.where((w <= 0) | (w > wmax), wmax, w)
    t = tl.load(Pos + b).to(tl.int32)
    lo_p = tl.maximum(sinks, t - wmax)
    span = t - w - lo_p + 1
    r_lo = (tl.maximum(lo_p - sinks, 0)) % wmax
    n_cand = tl.where(span > 0, tl.minimum(n_pages, (r_lo % PAGE + span - 1) // PAGE + 1), 0)
    first = r_lo // PAGE
    r = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * stride_qb + (hk * GROUP + r)[:, None] * stride_qh + offs_d[None, :],
                mask=(r < GROUP)[:, None], other=0.0).to(Bounds.dtype.element_ty)
    page = i * BLOCK_P + tl.arange(0, BLOCK_P)
    cand = ((page - first + n_pages) % n_pages < n_cand) & (page < n_pages)
    b_off = b * stride_bb + hk * stride_bh + page.to(tl.int64)[:, None] * (SLOTS * HEAD_DIM) + offs_d[None, :]
    both = _page_sums(Bounds, b_off, cand, HEAD_DIM, SLOTS)
    s = _centre_scores(q, both, Bounds.dtype.element_ty == tl.float32)
    s = tl.max(tl.where((r < GROUP)[:, None], s, float("-inf")), 0)
    bits = s.to(tl.int32, bitcast=True)
    key = tl.where(cand, bits ^ ((bits >> 31) & 0x7FFFFFFF), NO_KEY)  # float order as signed int order
    k = tl.minimum(tl.minimum(tl.maximum(tl.load(Pages).to(tl.int32), 0), K_TOP), n_cand)
    if P_POW2 == BLOCK_P:  # one program sees every page
        _choose_pages(key, k, Sel, pid, P_POW2, K_TOP, K_MAX, HAS_TOPK)
    else:
        row = Keys + pid.to(tl.int64) * P_POW2
        tl.store(row + page, key)
        tl.debug_barrier()  # every thread's keys stored before the count says so
        done = tl.atomic_add(Counter + pid, 1, sem="acq_rel")
        if done == P_POW2 // BLOCK_P - 1:  # the others' keys are visible (acquire)
            keys = tl.load(row + tl.arange(0, P_POW2), cache_modifier=".cg")
            _choose_pages(keys, k, Sel, pid, P_POW2, K_TOP, K_MAX, HAS_TOPK)
            tl.atomic_xchg(Counter + pid, 0, sem="relaxed")  # ready for the next layer and step


@triton.jit
def _sel_blocks(acc, l_i, m_i, q, K, V, Sel, sel_base, kv_base, stride_kn, stride_vn, offs_d,
                u0, u1, count, t, w, sinks, wmax, qk_scale, PAGE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Online softmax over the rows of the chosen pages (sel[sel_base + u // PAGE], virtual rows [u0, u1)), those
    filled and outside the window; each block's page numbers are loaded in the rows' own layout (loading them a
    block ahead, carried through the loop, broke Triton 3.6's layout pass)."""
    for start in range(u0, u1, BLOCK_N):
        u = start + tl.arange(0, BLOCK_N)
        live = u < count
        page = tl.load(Sel + sel_base + u // PAGE, mask=live, other=-1)
        r = page * PAGE + u % PAGE
        p = _held_positions(r, t, sinks, wmax)
        live = live & (page >= 0) & (p >= 0) & (t - p >= w)
        rows = tl.where(live, sinks + r, 0).to(tl.int64)
        k = load_rows(K, kv_base, rows, live, offs_d, stride_kn)
        v = load_rows(V, kv_base, rows, live, offs_d, stride_vn)
        acc, l_i, m_i = decode_step(acc, l_i, m_i, q, k, v, live, qk_scale)
    return acc, l_i, m_i


@triton.jit
def _write_row_bounds(kn, vn, K, V, Bounds, kv_base, b_base, stride_kn, stride_vn, offs_d, t, sinks, wmax,
                      HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, SLOTS: tl.constexpr):
    """budget_bounds' decode write from registers: the new row at slot(t), then its page's bounds from the page's
    filled rows (the new one taken from registers). Call once every read of the old row is done."""
    new_row = tl.where(t < sinks, t, sinks + (t - sinks) % wmax)
    tl.store(K + kv_base + new_row.to(tl.int64) * stride_kn + offs_d, kn.to(K.dtype.element_ty))
    tl.store(V + kv_base + new_row.to(tl.int64) * stride_vn + offs_d, vn.to(V.dtype.element_ty))
    if t >= sinks:  # a ring row: in page (t - sinks) % wmax // PAGE
        page = ((t - sinks) % wmax) // PAGE
        r = page * PAGE + tl.arange(0, PAGE)
        filled = r < t + 1 - sinks  # before the ring wraps, offsets past the new token are empty
        rows = (sinks + r).to(tl.int64)
        k = tl.load(K + kv_base + rows[:, None] * stride_kn + offs_d[None, :], mask=filled[:, None], other=0.0)
        k = tl.where((rows == new_row)[:, None], kn[None, :].to(k.dtype), k).to(tl.float32)
        lo = tl.min(tl.where(filled[:, None], k, float("inf")), 0)
        hi = tl.max(tl.where(filled[:, None], k, float("-inf")), 0)
        store_bounds(Bounds + b_base + page.to(tl.int64) * (SLOTS * HEAD_DIM) + offs_d, lo, hi, HEAD_DIM, SLOTS)


@triton.jit
def _budget_attend_kernel(
    Q, QS, KN, VN, K, V, Pos, Window, Pages, Sel, Bounds, Counter,
    stride_qb, stride_qh, stride_nb, stride_nh, stride_kb, stride_kh, stride_kn, stride_vn, stride_bb, stride_bh,
    H_kv, GROUP, C, sinks, sm_scale,
    PartO, PartM, PartL, Out, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr,
    K_MAX: tl.constexpr, SPLITS: tl.constexpr, WRITE: tl.constexpr, USE_PDL: tl.constexpr = False,
    SPLIT_EACH: tl.constexpr = True, SLOTS: tl.constexpr = 2,
):
    # _budget_decode_split_kernel with the chosen pages read from sel per block (page order), the partials merged by
    # the last split program of each (stream, kv head) (counter: [>= B * H_kv] int32 zeros, left zeros), and, WRITE,
    # the new row and its page's bounds written by the program that finishes the (stream, kv head) last, after every
    # read of the row it overwrites (bounds: [B', H_kv, P, 2 or 3, D], last two dims contiguous). grid (SPLITS, B * H_kv)
    # The split of the blocks is known before the selection (k = min(pages, K_MAX, candidates) pages are chosen), so
    # with USE_PDL (a programmatic dependent of the selection) the sink and window blocks are read while the
    # selection runs, and the program waits for it only before the pages (and before any write of the bounds).
    split = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H_kv).to(tl.int64)
    hk = (pid_bh % H_kv).to(tl.int64)
    wmax = C - sinks
    w = tl.load(Window).to(tl.int32)
    w = tl.where((w <= 0) | (w > wmax), wmax, w)
    t = tl.load(Pos + b).to(tl.int32)
    n_sink = tl.minimum(sinks, t)
    first_pos = tl.maximum(t + 1 - w, n_sink)
    n_ring = t + 1 - first_pos
    sel_base = pid_bh.to(tl.int64) * K_MAX
    n_pages = wmax // PAGE  # the selection's candidates (_budget_score_kernel): how many it chooses
    lo_p = tl.maximum(sinks, t - wmax)
    span = t - w - lo_p + 1
    r_lo = (tl.maximum(lo_p - sinks, 0)) % wmax
    n_cand = tl.where(span > 0, tl.minimum(n_pages, (r_lo % PAGE + span - 1) // PAGE + 1), 0)
    n_page = tl.minimum(tl.minimum(tl.maximum(tl.load(Pages).to(tl.int32), 0), K_MAX), n_cand) * PAGE
    qk_scale = sm_scale * LOG2E

    r = tl.arange(0, BLOCK_M)
    valid = r < GROUP
    head = hk * GROUP + r
    offs_d = tl.arange(0, HEAD_DIM)
    q_off = b * stride_qb + head[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(Q + q_off, mask=valid[:, None], other=0.0)
    qs = tl.load(QS + q_off, mask=valid[:, None], other=0.0)
    kn = tl.load(KN + b * stride_nb + hk * stride_nh + offs_d)
    vn = tl.load(VN + b * stride_nb + hk * stride_nh + offs_d)

    nsb = tl.cdiv(n_sink, BLOCK_N)
    nwb = tl.cdiv(n_ring, BLOCK_N)
    npb = tl.cdiv(n_page, BLOCK_N)
    if SPLIT_EACH:  # each split takes a share of the sink + window blocks and a share of the page blocks
        per = tl.cdiv(nsb + nwb, SPLITS)
        t0 = tl.minimum(split * per, nsb + nwb)
        t1 = tl.minimum(t0 + per, nsb + nwb)
        per = tl.cdiv(npb, SPLITS)
        p0 = tl.minimum(split * per, npb)
        p1 = tl.minimum(p0 + per, npb)
    else:  # one share of the blocks in order: sinks, window, pages
        per = tl.cdiv(nsb + nwb + npb, SPLITS)
        t0 = tl.minimum(split * per, nsb + nwb + npb)
        t1 = tl.minimum(t0 + per, nsb + nwb + npb)
        p0 = tl.maximum(t0, nsb + nwb) - nsb - nwb
        p1 = tl.maximum(t1, nsb + nwb) - nsb - nwb
    kv_base = b * stride_kb + hk * stride_kh
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + NEG_BIG
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    acc, l_i, m_i = _budget_blocks(acc, l_i, m_i, qs, K, V, Sel, kv_base, stride_kn, stride_vn, offs_d,
                                   kn, vn, tl.minimum(t0, nsb) * BLOCK_N, tl.minimum(t1, nsb) * BLOCK_N, n_sink, 0,
                                   t, w, sinks, wmax, qk_scale, 0, PAGE, BLOCK_N, K_MAX)
    lo, hi = tl.minimum(tl.maximum(t0, nsb), nsb + nwb) - nsb, tl.minimum(tl.maximum(t1, nsb), nsb + nwb) - nsb
    acc, l_i, m_i = _budget_blocks(acc, l_i, m_i, q, K, V, Sel, kv_base, stride_kn, stride_vn, offs_d,
                                   kn, vn, lo * BLOCK_N, hi * BLOCK_N, n_ring, first_pos,
                                   t, w, sinks, wmax, qk_scale, 1, PAGE, BLOCK_N, K_MAX)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()  # the selection complete and its list visible (and its reads of the bounds done)
    acc, l_i, m_i = _sel_blocks(acc, l_i, m_i, q, K, V, Sel, sel_base, kv_base, stride_kn, stride_vn, offs_d,
                                p0 * BLOCK_N, p1 * BLOCK_N, n_page, t, w, sinks, wmax, qk_scale, PAGE, BLOCK_N)
    b_base = b * stride_bb + hk * stride_bh
    if SPLITS == 1:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(Out + b * stride_ob + head[:, None] * stride_oh + offs_d[None, :], out.to(Out.dtype.element_ty),
                 mask=valid[:, None])
        if WRITE:
            tl.debug_barrier()  # every thread's reads of the row done before it is overwritten
            _write_row_bounds(kn, vn, K, V, Bounds, kv_base, b_base, stride_kn, stride_vn, offs_d, t, sinks, wmax,
                              HEAD_DIM, PAGE, SLOTS)
    else:
        part = (pid_bh.to(tl.int64) * SPLITS + split) * BLOCK_M
        tl.store(PartO + (part + r[:, None]) * HEAD_DIM + offs_d[None, :], acc)
        tl.store(PartM + part + r, m_i)
        tl.store(PartL + part + r, l_i)
        tl.debug_barrier()  # every thread's partials stored (and reads done) before the count says so
        done = tl.atomic_add(Counter + pid_bh, 1, sem="acq_rel")
        if done == SPLITS - 1:  # the others' partials are visible and their reads done (acquire)
            s = tl.arange(0, SPLITS)
            for g in range(GROUP):
                o = merge_splits(PartO, PartM, PartL, (pid_bh.to(tl.int64) * SPLITS + s) * BLOCK_M + g,
                                 offs_d, HEAD_DIM, True)
                tl.store(Out + b * stride_ob + (hk * GROUP + g) * stride_oh + offs_d, o.to(Out.dtype.element_ty))
            if WRITE:
                _write_row_bounds(kn, vn, K, V, Bounds, kv_base, b_base, stride_kn, stride_vn, offs_d, t, sinks,
                                  wmax, HEAD_DIM, PAGE, SLOTS)
            tl.atomic_xchg(Counter + pid_bh, 0, sem="relaxed")


def k_max_for(pages: int) -> int:
    """The k_max a graph is captured for, serving every run-time k up to `pages`: a power of two >= pages."""
    return 1 << max(int(pages) - 1, 0).bit_length()


def selection_length(k_max: int, page: int) -> int:
    """Entries of the selection list: k_max as a power of two, at least one block of DECODE_BLOCK_N rows."""
    if page > DECODE_BLOCK_N or DECODE_BLOCK_N % page:
        raise ValueError(f"page: expected a power of two up to {DECODE_BLOCK_N} rows (the kernel's block), found {page}")
    return max(k_max_for(k_max), DECODE_BLOCK_N // page)


HAS_TOPK = hasattr(tl, "topk")  # Triton >= 3.5: a bitonic top-k; before, a full sort


BUDGET_MIN_BLOCKS_PER_SPLIT = 2  # v2 (each split takes a share of the window and of the pages, PDL overlapping the
# selection): more splits than the window's rule (a quarter of the blocks) paid at batch 1 on the H200


def budget_splits(batch_kv_heads: int, sinks: int, window_keys: int, k_max: int, page: int, sms: int) -> int:
    """Splits per kv head from the rows the budget reads at most (sinks + W + K_MAX * page): cached_decode_splits,
    capped at a power of two <= blocks / BUDGET_MIN_BLOCKS_PER_SPLIT instead of blocks / 4 (the first path: as
    cached_decode_splits)."""
    keys = window_keys + k_max * page
    if legacy_path():
        return cached_decode_splits(batch_kv_heads, sinks, keys, sms)
    rows = max(sinks + keys, 1)
    blocks = -(-rows // DECODE_BLOCK_N)
    cap = 1 << (max(blocks // BUDGET_MIN_BLOCKS_PER_SPLIT, 1).bit_length() - 1)
    busy = -(-PROGRAMS_PER_SM * sms // batch_kv_heads)
    busy = 1 << (busy.bit_length() - 1)
    return min(max(decode_splits(batch_kv_heads, rows, sms), busy), cap)


SELECT_BLOCKS = (128, 64, 32)  # pages a scoring program takes (v2), the largest giving SELECT_PROGRAMS_PER_SM
SELECT_PROGRAMS_PER_SM = 4  # H200, 512 pages: 128 at batch 64 (12.8 us against 14.5 for 64), 32 at batch 1 (5.0, 5.3)


def select_block(batch_kv_heads: int, p_pow2: int, sms: int) -> int:
    """Pages a scoring program takes: the largest of SELECT_BLOCKS that still gives SELECT_PROGRAMS_PER_SM programs an
    SM (many streams: fewer, longer programs), else the smallest (few streams: the most programs)."""
    for block in SELECT_BLOCKS:
        if batch_kv_heads * max(p_pow2 // block, 1) >= SELECT_PROGRAMS_PER_SM * sms:
            return block
    return SELECT_BLOCKS[-1]


def _sms(t) -> int:
    import torch

    return torch.cuda.get_device_properties(t.device).multi_processor_count if t.is_cuda else INTERPRETER_SMS


# The v2 attention's launch (H200 sweeps, SmolLM2 shape, W 256 + 48 pages of 16, selection + attention + write at
# batch 64 / 1; benchmarks/results/budget_h200_2026-12-03.json): 128 keys a block (36.9 / 11.7 us against 44.6 / 14.1
# for 64), 4 warps, 2 stages (3: 44.0 / 12.2), each split a share of the window and of the pages (with PDL the window
# shares overlap the selection; at 64 keys a block 14.9 against 18.6 us in order at batch 1)
ATTEND_TUNING = {"num_stages": 2, "SPLIT_EACH": True, "num_warps": 4, "BLOCK_N": 128}
SELECT_TUNING = {"num_warps": 4}  # the v2 scoring programs


def legacy_path() -> bool:
    """EDGEATTN_BUDGET_V1=1: the first CUDA path (one selection program a stream and kv head sorting its keys, the
    split kernel, the reduce kernel, then budget_bounds.ring_write_bounds); read at each launch, so a benchmark
    can compare both in one process. Otherwise the v2 kernels above."""
    return os.environ.get("EDGEATTN_BUDGET_V1", "0") == "1"


_COUNTERS: dict = {}
_RETIRED: list = []  # counters outgrown: kept, since a captured graph may still count in them


def _counter(device, n: int):
    """[>= n] int32 zeros on the device, left zeros by every kernel that counts in it (shared, like the step's)."""
    import torch

    key = str(device)
    c = _COUNTERS.get(key)
    if c is None or c.numel() < n:
        if c is not None:
            _RETIRED.append(c)
        c = _COUNTERS[key] = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
    return c


def _slots(bounds) -> int:
    """Vectors a page's bounds hold: 2 (min, max) or 3 (min, max, min + max: the selection reads one), last two dims
    contiguous."""
    if bounds.dim() != 5 or bounds.shape[3] not in (2, 3) or bounds.stride(-1) != 1 \
            or bounds.stride(-2) != bounds.shape[4]:
        raise ValueError(f"bounds: expected [B, H_kv, P, 2 or 3, D] with its last two dims contiguous, found "
                         f"{list(bounds.shape)} strides {list(bounds.stride())}")
    return int(bounds.shape[3])


def select_pages(q, bounds, positions, window, pages, *, sinks: int, page: int, k_max: int,
                 block_p: int | None = None, legacy: bool | None = None, pdl: bool = False):
    """The chosen pages of every (stream, kv head): int32 [B * H_kv, K_MAX], the k chosen first (in page order; the
    legacy path: best first), -1 past the k-th. q: [B, H, D] rotated at t; bounds: [B', H_kv, P, 2 or 3, D]; pages: []
    int64 (clamped to K_MAX). block_p: pages a scoring program takes (v2; default select_block). pdl: the next
    launch is a programmatic dependent (budget_decode's attention)."""
    import torch

    q = last_dim_contiguous(q)
    b, h, d = q.shape
    h_kv, n_pages = bounds.shape[1], bounds.shape[2]
    p_pow2 = max(16, triton.next_power_of_2(n_pages))
    k_max = selection_length(k_max, page)
    sel = torch.empty((b * h_kv, k_max), device=q.device, dtype=torch.int32)
    block_m = max(16, triton.next_power_of_2(h // h_kv))
    const = dict(HEAD_DIM=d, PAGE=int(page), BLOCK_M=block_m, P_POW2=p_pow2, K_TOP=min(k_max, p_pow2), K_MAX=k_max,
                 HAS_TOPK=HAS_TOPK, SLOTS=_slots(bounds))
    if legacy_path() if legacy is None else legacy:
        _budget_select_kernel[(b * h_kv,)](
            q, bounds, positions, window, pages, sel,
            q.stride(0), q.stride(1), bounds.stride(0), bounds.stride(1),
            h_kv, h // h_kv, int(sinks), n_pages * page, n_pages, BLOCK_P=min(p_pow2, 128), num_warps=4, **const)
        return sel
    block_p = min(p_pow2, max(16, int(block_p or select_block(b * h_kv, p_pow2, _sms(q)))))
    keys = sel if block_p == p_pow2 else torch.empty((b * h_kv, p_pow2), device=q.device, dtype=torch.int32)
    _budget_score_kernel[(p_pow2 // block_p, b * h_kv)](
        q, bounds, positions, window, pages, keys, sel, _counter(q.device, 2 * b * h_kv),
        q.stride(0), q.stride(1), bounds.stride(0), bounds.stride(1),
        h_kv, h // h_kv, int(sinks), n_pages * page, n_pages, BLOCK_P=block_p, USE_PDL=bool(pdl), **SELECT_TUNING,
        **const)
    return sel


def budget_decode(q, q_sink, k, v, k_cache, v_cache, bounds, positions, window, pages, *, sinks: int,
                  page: int, k_max: int, scale: float = 0.0, window_keys: int | None = None,
                  splits: int | None = None, write: bool = False, block_p: int | None = None,
                  legacy: bool | None = None, pdl: bool | None = None):
    """Attention of one new token per stream under the budget, the cache read as it was before the token.
    q, q_sink: [B, H, D]; k, v: [B, H_kv, D] (the new token); k_cache, v_cache: [B', H_kv, C, D]; bounds:
    [B', H_kv, P, 2 or 3, D]; positions: [B] int64; window, pages: [] int64 on the device; k_max: the largest k this
    launch serves. Returns [B, H, D]. write: then write each stream's new row and its page's bounds (as
    budget_bounds.ring_write_bounds), in the attention launch itself (v2: by the program that finishes the stream
    and kv head last, after every read of the overwritten row); else writes nothing. Two launches (v2): the
    selection, the attention; pdl (default: dependent_launch, Hopper and newer unless EDGEATTN_PDL=0): the attention
    as a programmatic dependent of the selection, reading the sinks and the window while the pages are chosen.
    legacy: the first path (default: EDGEATTN_BUDGET_V1)."""
    import torch

    from edgeattn.plugins.kernels.budget_bounds import _check, ring_write_bounds
    from edgeattn.plugins.kernels.dependent_launch import dependent_launch

    legacy = legacy_path() if legacy is None else legacy
    pdl = (dependent_launch(q.device) if pdl is None else bool(pdl)) and not legacy
    q, q_sink, k, v = (last_dim_contiguous(t) for t in (q, q_sink, k, v))
    b, h, d = q.shape
    h_kv, c = k_cache.shape[1], k_cache.shape[2]
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache, v_cache: expected a contiguous last dim")
    if write:
        _check(k_cache, v_cache, bounds, page, sinks)
    group = h // h_kv
    sel = select_pages(q, bounds, positions, window, pages, sinks=sinks, page=page, k_max=k_max, block_p=block_p,
                       legacy=legacy, pdl=pdl)
    k_max = sel.shape[1]
    block_m = max(16, triton.next_power_of_2(group))
    sms = _sms(q)
    keys = c - sinks if window_keys is None else window_keys
    n_split = splits or budget_splits(b * h_kv, sinks, keys, k_max, page, sms)
    parts = (b * h_kv, n_split, block_m) if n_split > 1 else (1, 1, 1)
    part_o = torch.empty((*parts, d), device=q.device, dtype=torch.float32)
    part_m = torch.empty(parts, device=q.device, dtype=torch.float32)
    part_l = torch.empty_like(part_m)
    out = torch.empty((b, h, 1, d), device=q.device, dtype=q.dtype)
    if not legacy:
        counter = _counter(q.device, 2 * b * h_kv)[b * h_kv:]  # the selection counts in the first B * H_kv
        _budget_attend_kernel[(n_split, b * h_kv)](
            q, q_sink, k, v, k_cache, v_cache, positions, window, pages, sel, bounds, counter,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), k_cache.stride(0), k_cache.stride(1),
            k_cache.stride(2), v_cache.stride(2), bounds.stride(0), bounds.stride(1),
            h_kv, group, c, int(sinks), float(scale or d ** -0.5),
            part_o, part_m, part_l, out, out.stride(0), out.stride(1),
            HEAD_DIM=d, BLOCK_M=block_m, PAGE=int(page), K_MAX=k_max, SPLITS=n_split, WRITE=bool(write),
            SLOTS=_slots(bounds), **ATTEND_TUNING, **({"USE_PDL": True, "launch_pdl": True} if pdl else {}),
        )
        return out[:, :, 0]
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
    if write:
        ring_write_bounds(k, v, k_cache, v_cache, bounds, positions, sinks=sinks, page=page)
    return out[:, :, 0]


__all__ = ["ATTEND_TUNING", "HAS_TOPK", "budget_decode", "budget_splits", "k_max_for", "legacy_path", "select_block",
           "select_pages", "selection_length"]
