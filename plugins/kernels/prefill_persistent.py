"""The persistent sm_90 prefill kernel for windows much shorter than the sequence
(`_windowed_fwd_persistent_kernel`): JIT only, causal, no padding; `prefill_hopper.hopper_prefill` runs it
when `HopperVariant.persistent` > 0.

With a short window every query tile visits the same few key blocks (W = 256, 64-row tiles: 5), and a
program per tile pays its fixed costs (q load, pipeline fill and drain, sink block, epilogue) over those
few blocks: measured on the H200 they cost about 4 blocks' time per tile. Here `persistent` programs per
SM each walk a strided list of (batch x head, query tile) work items in ONE software-pipelined loop over
(tile, key block) steps, so the next tile's q, K and V loads are in flight while the current tile
finishes. Every tile takes the same number of steps `nb` (the block count of a full tile, from the
window read on the device); a tile near the sequence start that needs fewer blocks runs masked ones.

Masks split the work exactly: a window block keeps keys j with p - W < j <= p; the sinks left of a row's
window (j < sinks, j <= p - W) come from one narrow block (SINK_N keys) on the tile's last step, with
the epilogue. Reads top to bottom: the tile's coordinates, the kernel, the launch `persistent_prefill`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgeattn.plugins.kernels.common import LOG2E, NEG_BIG, dot, effective_window, mma


@triton.jit
def _tile_coords(work, n_tiles_m, H, GROUP, S_q, S_k, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Work item -> b, h, hk (int32), the tile's first query row, its first key block start_n."""
    bh = work // n_tiles_m
    first = (work - bh * n_tiles_m) * BLOCK_M
    b = bh // H
    h = bh - b * H
    p_min = first + S_k - S_q
    start_n = (tl.maximum(p_min - window + 1, 0) // BLOCK_N) * BLOCK_N
    return b, h, h // GROUP, first, start_n


@triton.jit
def _blocks_per_tile(S_q, S_k, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key blocks of a full (unclipped) tile: the same for every tile when BLOCK_N divides BLOCK_M, since
    every tile's first position is congruent to S_k - S_q modulo BLOCK_N."""
    r = (S_k - S_q) % BLOCK_N
    shift = tl.cdiv(window, BLOCK_N) + 1  # floor division of a negative number, through a positive one
    lo_blk = (r - window + 1 + shift * BLOCK_N) // BLOCK_N - shift
    return tl.cdiv(r + BLOCK_M, BLOCK_N) - lo_blk


@triton.jit
def _windowed_fwd_persistent_kernel(
    Q, K, V, Kp, Vp, Window, Out,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om,
    H, GROUP, S_q, S_k, n_tiles_m, n_work,
    sinks, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SINK_N: tl.constexpr,
    LOOP_STAGES: tl.constexpr, EDGE_MASKS: tl.constexpr,
):
    # Q, K, V: 4-D tensor descriptors over [B, H(kv), S, D] (block [1, 1, BLOCK, D]); Kp, Vp: K, V as pointers
    # (the sink block); out: [B, H, S_q, D]; window: [] int64. EDGE_MASKS: mask only the blocks that cross a
    # row's window edge or the diagonal (a branch per block); else every block (no branch).
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    window = effective_window(Window, S_k)
    qk_scale = sm_scale * LOG2E  # exp2 instead of exp
    nb = _blocks_per_tile(S_q, S_k, window, BLOCK_M, BLOCK_N)
    n_steps = tl.cdiv(n_work - pid, nprog) * nb
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + NEG_BIG  # m_i, l_i: [BLOCK_M] running max and sum
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)  # acc: [BLOCK_M, D]
    for step in tl.range(0, n_steps, num_stages=LOOP_STAGES):
        i = step // nb
        blk = step - i * nb
        b, h, hk, first, start_n = _tile_coords(pid + i * nprog, n_tiles_m, H, GROUP, S_q, S_k, window, BLOCK_M,
                                                BLOCK_N)
        start = start_n + blk * BLOCK_N
        q = Q.load([b, h, first, 0]).reshape(BLOCK_M, HEAD_DIM)  # q: [BLOCK_M, D] (rows past S_q: zeros)
        k = K.load([b, hk, start, 0]).reshape(BLOCK_N, HEAD_DIM)  # k, v: [BLOCK_N, D] (past S_k: zeros)
        v = V.load([b, hk, start, 0]).reshape(BLOCK_N, HEAD_DIM)
        qk = dot(q, tl.trans(k))  # qk: [BLOCK_M, BLOCK_N] fp32, unscaled
        pos = (first + S_k - S_q + offs_m)[:, None]  # absolute query positions
        j = (start + tl.arange(0, BLOCK_N))[None, :]
        if EDGE_MASKS:
            p_min = first + S_k - S_q
            full_lo = tl.cdiv(tl.maximum(p_min + BLOCK_M - window, 0), BLOCK_N) * BLOCK_N
            if (start < full_lo) | (start + BLOCK_N > p_min + 1):
                qk = tl.where((j <= pos) & (j > pos - window), qk, float("-inf"))
        else:
            qk = tl.where((j <= pos) & (j > pos - window), qk, float("-inf"))
        m_prev = tl.where(blk == 0, NEG_BIG, m_i)  # a new tile starts from nothing
        m_i = tl.maximum(m_prev, tl.max(qk, 1) * qk_scale)  # log2 domain
        p_ij = tl.math.exp2(qk * qk_scale - m_i[:, None])
        alpha = tl.where(blk == 0, 0.0, tl.math.exp2(m_prev - m_i))
        l_i = l_i * alpha + tl.sum(p_ij, 1)
        acc = acc * alpha[:, None]
        acc = mma(p_ij.to(v.dtype), v, acc)
        if blk == nb - 1:  # the tile's last step: the sinks left of each row's window, then the epilogue
            if SINK_N > 0:
                offs_s = tl.arange(0, SINK_N)
                k_base = b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
                v_base = b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
                real = offs_s < sinks
                ks = tl.load(Kp + k_base + offs_s[:, None] * stride_kn + offs_d[None, :], mask=real[:, None],
                             other=0.0)  # ks, vs: [SINK_N, D]
                vs = tl.load(Vp + v_base + offs_s[:, None] * stride_vn + offs_d[None, :], mask=real[:, None],
                             other=0.0)
                qs = dot(q, tl.trans(ks))  # qs: [BLOCK_M, SINK_N]
                qs = tl.where(real[None, :] & (offs_s[None, :] <= pos - window), qs, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(qs, 1) * qk_scale)
                p_s = tl.math.exp2(qs * qk_scale - m_new[:, None])
                alpha = tl.math.exp2(m_i - m_new)
                l_i = l_i * alpha + tl.sum(p_s, 1)
                acc = acc * alpha[:, None]
                acc = mma(p_s.to(vs.dtype), vs, acc)
                m_i = m_new
            rows = first + offs_m
            out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # rows with no attended key -> zeros
            o_ptrs = (Out + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + rows[:, None] * stride_om
                      + offs_d[None, :])
            tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=(rows < S_q)[:, None])


def persistent_problem(q, k, v, *, causal, key_padding_mask, sinks, tile) -> str | None:
    """Why the persistent kernel cannot run this call (None: it can)."""
    bm, bn = tile[0], tile[1]
    if not causal:
        return "the persistent prefill is causal only"
    if key_padding_mask is not None:
        return "the persistent prefill takes no padding mask"
    if bm % bn:
        return f"the persistent prefill needs BLOCK_N dividing BLOCK_M, found {bm}x{bn}"
    if sinks > 128:
        return f"the persistent prefill takes at most 128 sinks, found {sinks}"
    return None


def persistent_prefill(q, k, v, window, *, sinks, scale, tile, programs_per_sm, stages, sms, edge_masks=False):
    """Run `_windowed_fwd_persistent_kernel` (q, k, v: [B, H(kv), S, D], last dim contiguous, 16-byte aligned;
    check `persistent_problem` first). Grid: min(work items, sms * programs_per_sm) programs. edge_masks: mask
    only the blocks that cross a window edge or the diagonal (a branch per block) rather than every block."""
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    b, h, s_q, d = q.shape
    h_kv, s_k = k.shape[1], k.shape[2]
    bm, bn, warps, _ = tile
    out = torch.empty_like(q)  # out: [B, H, S_q, D]
    n_tiles_m = triton.cdiv(s_q, bm)
    n_work = b * h * n_tiles_m
    qa = TensorDescriptor(q, list(q.shape), list(q.stride()), [1, 1, bm, d])
    ka = TensorDescriptor(k, list(k.shape), list(k.stride()), [1, 1, bn, d])
    va = TensorDescriptor(v, list(v.shape), list(v.stride()), [1, 1, bn, d])
    sink_n = 0 if sinks <= 0 else max(16, 1 << (int(sinks) - 1).bit_length())
    grid = (min(n_work, max(1, sms * programs_per_sm)),)
    _windowed_fwd_persistent_kernel[grid](
        qa, ka, va, k, v, window, out,
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        h, h // h_kv, s_q, s_k, n_tiles_m, n_work, int(sinks), float(scale or d ** -0.5),
        HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, SINK_N=sink_n, LOOP_STAGES=stages, EDGE_MASKS=bool(edge_masks),
        num_warps=warps, num_stages=stages,
    )
    return out


__all__ = ["persistent_prefill", "persistent_problem"]
