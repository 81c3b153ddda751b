"""The sm_90 prefill kernel (`_windowed_fwd_hopper_kernel`): JIT only, the CUDA default on sm_90.

`dispatch.windowed_prefill` runs it when `tuning.PREFILL_HOPPER` or a `tuning.PREFILL_WINDOW_TABLE` row
says so, or when the caller passes `hopper=HopperVariant(...)`; the AOT builds and TensorRT plugins keep
`prefill._windowed_fwd_kernel`. Same prologue (common.query_tile, common.key_blocks) and result as that
kernel; what differs:

- DESC: Q, K, V arrive as host-built 4-D tensor descriptors over [B, H(kv), S, D] with block
  [1, 1, BLOCK, D]: TMA bulk copies, rows past this head's S read as zeros, no scratch allocator.
- two loops: an unmasked band (blocks inside every row's window: no mask, no bounds checks, plain or
  TMA loads, `tl.range(num_stages=LOOP_STAGES)`, optionally warp-specialized), then one masked loop
  over the edge blocks (window start, diagonal / right edge / sequence end) and the sinks.
- FOLD_SCALE: q is multiplied by scale / ln 2 once (in fp32, rounded back to q's dtype) so a score
  needs only a subtraction before exp2 (costs one extra rounding of q).
- SINK_N > 0 (HopperVariant.sink_block): the sinks left of the window as one narrow block (16 keys for
  up to 16 sinks, a per-key mask) after the loops, not a whole masked BLOCK_N block in the edge loop:
  at W = 256 with 64-key blocks that block was a sixth of each tile's work.
- ONE_LOOP: band and edges in one pipelined loop, masks chosen per block (SPLIT: the diagonal blocks by
  the causal test alone); RCP_EPILOGUE, TMA_STORE: the epilogue's reciprocal and descriptor store.

Reads top to bottom: the load and softmax steps, the sink block, the loops, the kernel,
`sink_block_keys`, `descriptor_problem` and the public launch `hopper_prefill`. The persistent kernel for
short windows (HopperVariant.persistent) is prefill_persistent.py.
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgeattn.plugins.kernels.common import (NEG_BIG, dot, key_allowed, key_blocks, load_block, mask_scores, mma,
                                             query_tile)
from edgeattn.plugins.kernels.launch import device_arch, last_dim_contiguous, mask_argument
from edgeattn.plugins.kernels.prefill_persistent import persistent_prefill, persistent_problem
from edgeattn.plugins.kernels.tuning import HopperVariant, prefill_tile


@triton.jit
def _hopper_load(T, base, bh0, bh1, start, offs_n, offs_d, stride_n, S,
                 BOUNDS: tl.constexpr, DESC: tl.constexpr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """One [ROWS, D] tile of K, V or Q: rows [start, start + ROWS) of head (bh0, bh1); BOUNDS: rows at or
    past S read as zeros (descriptors always do)."""
    if DESC:
        t = T.load([bh0, bh1, start, 0]).reshape(ROWS, HEAD_DIM)
    else:
        t = load_block(T, base, start, offs_n, offs_d, stride_n, S, BOUNDS, False)
    return t


@triton.jit
def _hopper_softmax(acc, l_i, m_i, qk, v, qk_scale, FOLD_SCALE: tl.constexpr):
    """The online-softmax update for a block's masked scores qk [BLOCK_M, N] and its values v [N, D] (log2
    domain; FOLD_SCALE: qk already times scale / ln 2). Returns the updated acc, l_i, m_i."""
    if FOLD_SCALE:
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p_ij = tl.math.exp2(qk - m_new[:, None])
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p_ij = tl.math.exp2(qk * qk_scale - m_new[:, None])  # one FMA per score
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p_ij, 1)
    acc = acc * alpha[:, None]
    acc = mma(p_ij.to(v.dtype), v, acc)
    return acc, l_i, m_new


@triton.jit
def _hopper_step(acc, l_i, m_i, q, K, V, k_base, v_base, b, hk, stride_kn, stride_vn, start, offs_d, pos,
                 Mask, mask_base, window, sinks, S_k, qk_scale,
                 MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, FOLD_SCALE: tl.constexpr,
                 DESC: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    # One online-softmax step over the key block at `start` (MASKED: window mask and S_k bounds).
    # q: [BLOCK_M, D]; k, v: [BLOCK_N, D]; acc: [BLOCK_M, D] fp32; log2 domain
    offs_n = start + tl.arange(0, BLOCK_N)  # absolute key positions
    k = _hopper_load(K, k_base, b, hk, start, offs_n, offs_d, stride_kn, S_k, MASKED, DESC, BLOCK_N, HEAD_DIM)
    v = _hopper_load(V, v_base, b, hk, start, offs_n, offs_d, stride_vn, S_k, MASKED, DESC, BLOCK_N, HEAD_DIM)
    qk = dot(q, tl.trans(k))  # qk: [BLOCK_M, BLOCK_N] fp32 (FOLD_SCALE: already times scale / ln 2)
    qk = mask_scores(qk, pos, offs_n, Mask, mask_base, window, sinks, S_k, MASKED, CAUSAL, HAS_PAD)
    return _hopper_softmax(acc, l_i, m_i, qk, v, qk_scale, FOLD_SCALE)


@triton.jit
def _hopper_sinks(acc, l_i, m_i, q, Kp, Vp, k_base, v_base, Mask, mask_base, stride_kn, stride_vn, offs_d,
                  sink_stop, qk_scale, HAS_PAD: tl.constexpr, FOLD_SCALE: tl.constexpr, SINK_N: tl.constexpr):
    # The sinks left of the window, keys [0, sink_stop) (sink_stop <= sinks <= SINK_N), as one narrow block:
    # every row attends them, so the mask is per key. Plain loads (Kp, Vp: pointers even when K, V are
    # descriptors). Run after the loops: its shared-memory buffers then reuse theirs (before them, the
    # kernel needed 8 KiB more at 64x64 and 2 programs no longer fitted an SM).
    offs_n = tl.arange(0, SINK_N)
    real = offs_n < sink_stop
    k = tl.load(Kp + k_base + offs_n[:, None] * stride_kn + offs_d[None, :], mask=real[:, None], other=0.0)
    v = tl.load(Vp + v_base + offs_n[:, None] * stride_vn + offs_d[None, :], mask=real[:, None], other=0.0)
    if HAS_PAD:
        real = real & (tl.load(Mask + mask_base + offs_n, mask=real, other=0) != 0)
    qk = dot(q, tl.trans(k))  # qk: [BLOCK_M, SINK_N] fp32
    qk = tl.where(real[None, :], qk, float("-inf"))
    return _hopper_softmax(acc, l_i, m_i, qk, v, qk_scale, FOLD_SCALE)


@triton.jit
def _hopper_edges(acc, l_i, m_i, q, K, V, Mask, k_base, v_base, mask_base, b, hk, stride_kn, stride_vn,
                  pos, offs_d, start_n, full_lo, full_hi, end_blk, sink_stop, window, sinks, S_k, qk_scale,
                  CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, FOLD_SCALE: tl.constexpr, DESC: tl.constexpr,
                  BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, SINK_N: tl.constexpr):
    # One masked loop over the few edge blocks: window start [start_n, full_lo), diagonal / right edge /
    # sequence end [full_hi, end_blk), then (SINK_N == 0) the sinks left of the window [0, sink_stop).
    n_left = (full_lo - start_n) // BLOCK_N
    n_right = (end_blk - full_hi) // BLOCK_N
    n_edge = n_left + n_right
    n_sink = tl.cdiv(sink_stop, BLOCK_N) if SINK_N == 0 else 0
    for t in range(0, n_edge + n_sink):
        start = tl.where(t < n_left, start_n + t * BLOCK_N,
                         tl.where(t < n_edge, full_hi + (t - n_left) * BLOCK_N, (t - n_edge) * BLOCK_N))
        acc, l_i, m_i = _hopper_step(acc, l_i, m_i, q, K, V, k_base, v_base, b, hk, stride_kn, stride_vn, start,
                                     offs_d, pos, Mask, mask_base, window, sinks, S_k, qk_scale,
                                     True, CAUSAL, HAS_PAD, FOLD_SCALE, DESC, BLOCK_N, HEAD_DIM)
    return acc, l_i, m_i


@triton.jit
def _hopper_band(acc, l_i, m_i, q, K, V, Mask, k_base, v_base, mask_base, b, hk, stride_kn, stride_vn,
                 pos, offs_d, lo, hi, window, sinks, S_k, qk_scale,
                 CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, FOLD_SCALE: tl.constexpr, DESC: tl.constexpr,
                 BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, LOOP_STAGES: tl.constexpr,
                 WARP_SPEC: tl.constexpr):
    # blocks [lo, hi) lie inside every row's window and below S_k: no window mask, no bounds checks
    # (the padding mask, if any, still applies)
    # (the loop attribute tt.warp_specialize is set only when WARP_SPEC is true)
    for start_n in tl.range(lo, hi, BLOCK_N, num_stages=LOOP_STAGES, warp_specialize=WARP_SPEC):
        acc, l_i, m_i = _hopper_step(acc, l_i, m_i, q, K, V, k_base, v_base, b, hk, stride_kn, stride_vn, start_n,
                                     offs_d, pos, Mask, mask_base, window, sinks, S_k, qk_scale,
                                     False, CAUSAL, HAS_PAD, FOLD_SCALE, DESC, BLOCK_N, HEAD_DIM)
    return acc, l_i, m_i


@triton.jit
def _hopper_one_loop(acc, l_i, m_i, q, K, V, Mask, k_base, v_base, mask_base, b, hk, stride_kn, stride_vn,
                     pos, offs_d, start_n, full_lo, full_hi, end_blk, n_sink, window, sinks, S_k, qk_scale,
                     CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, FOLD_SCALE: tl.constexpr, DESC: tl.constexpr,
                     BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, LOOP_STAGES: tl.constexpr, SPLIT: tl.constexpr):
    # One software-pipelined loop (one prologue, the edge blocks' loads prefetched like the band's) over the
    # n_sink sink blocks, then the window's blocks [start_n, end_blk). Without padding only the edges pay for a
    # mask: the left edge (and sinks) the full test; the right edge the full test, or (SPLIT) the causal one.
    for t in tl.range(0, n_sink + (end_blk - start_n) // BLOCK_N, num_stages=LOOP_STAGES):
        start = tl.where(t < n_sink, t * BLOCK_N, start_n + (t - n_sink) * BLOCK_N)
        offs_n = start + tl.arange(0, BLOCK_N)  # absolute key positions
        k = _hopper_load(K, k_base, b, hk, start, offs_n, offs_d, stride_kn, S_k, True, DESC, BLOCK_N, HEAD_DIM)
        v = _hopper_load(V, v_base, b, hk, start, offs_n, offs_d, stride_vn, S_k, True, DESC, BLOCK_N, HEAD_DIM)
        qk = dot(q, tl.trans(k))  # qk: [BLOCK_M, BLOCK_N] fp32
        if HAS_PAD:
            qk = mask_scores(qk, pos, offs_n, Mask, mask_base, window, sinks, S_k, True, CAUSAL, HAS_PAD)
        elif start < full_lo:  # left edge or a sink block (sink blocks lie left of start_n <= full_lo)
            qk = tl.where(key_allowed(pos, offs_n, window, sinks, S_k, CAUSAL), qk, float("-inf"))
        elif start >= full_hi:
            if SPLIT:  # keys j >= p_max - W + 1: only j <= p can fail (and j <= p < S_k)
                qk = tl.where(offs_n[None, :] <= pos[:, None], qk, float("-inf"))
            else:
                qk = tl.where(key_allowed(pos, offs_n, window, sinks, S_k, CAUSAL), qk, float("-inf"))
        acc, l_i, m_i = _hopper_softmax(acc, l_i, m_i, qk, v, qk_scale, FOLD_SCALE)
    return acc, l_i, m_i


@triton.jit
def _windowed_fwd_hopper_kernel(
    Q, K, V, Kp, Vp, Window, Mask, OutD,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om,
    stride_mb,
    H, GROUP, S_q, S_k,
    sinks, sm_scale,
    Out,
    CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DESC: tl.constexpr, FOLD_SCALE: tl.constexpr,
    LOOP_STAGES: tl.constexpr, WARP_SPEC: tl.constexpr, SINK_N: tl.constexpr = 0, SPLIT: tl.constexpr = False,
    ONE_LOOP: tl.constexpr = False, RCP_EPILOGUE: tl.constexpr = False, TMA_STORE: tl.constexpr = False,
):
    # q, out: [B, H, S_q, D]; k, v: [B, H_kv, S_k, D] (DESC: 4-D descriptors over the same; Kp, Vp: the same
    # as pointers); window: [] int64; mask: [B, S_k] int8 (HAS_PAD)
    b, h, hk, window, qk_scale, first, rows, pos, p_min, p_max = query_tile(Window, H, GROUP, S_q, S_k,
                                                                            sm_scale, BLOCK_M)
    b32 = b.to(tl.int32)  # descriptor coordinates are int32
    hk32 = hk.to(tl.int32)
    offs_d = tl.arange(0, HEAD_DIM)

    q_base = b * stride_qb + h.to(tl.int64) * stride_qh
    k_base = b * stride_kb + hk * stride_kh
    v_base = b * stride_vb + hk * stride_vh
    mask_base = b * stride_mb
    q = _hopper_load(Q, q_base, b32, h, first, rows, offs_d, stride_qm, S_q, True, DESC, BLOCK_M, HEAD_DIM)
    if FOLD_SCALE:
        q = (q.to(tl.float32) * qk_scale).to(q.dtype)  # q: [BLOCK_M, D], scores come out in log2 units
    start_n, end_blk, full_lo, full_hi, sink_stop = key_blocks(p_min, p_max, window, sinks, S_k, CAUSAL, BLOCK_N)

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + NEG_BIG  # m_i, l_i: [BLOCK_M] running max and sum
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)  # acc: [BLOCK_M, D]
    if ONE_LOOP:  # 1) all key blocks in one pipelined loop (the sinks too unless SINK_N > 0)
        n_sink = tl.cdiv(sink_stop, BLOCK_N) if SINK_N == 0 else 0
        acc, l_i, m_i = _hopper_one_loop(acc, l_i, m_i, q, K, V, Mask, k_base, v_base, mask_base, b32, hk32,
                                         stride_kn, stride_vn, pos, offs_d, start_n, full_lo, full_hi, end_blk,
                                         n_sink, window, sinks, S_k, qk_scale, CAUSAL, HAS_PAD, FOLD_SCALE, DESC,
                                         BLOCK_N, HEAD_DIM, LOOP_STAGES, SPLIT)
    else:  # 1) the band (most of the work, no mask), 2) one masked loop over the edges (SINK_N == 0: the sinks)
        acc, l_i, m_i = _hopper_band(acc, l_i, m_i, q, K, V, Mask, k_base, v_base, mask_base, b32, hk32, stride_kn,
                                     stride_vn, pos, offs_d, full_lo, full_hi, window, sinks, S_k, qk_scale,
                                     CAUSAL, HAS_PAD, FOLD_SCALE, DESC, BLOCK_N, HEAD_DIM, LOOP_STAGES, WARP_SPEC)
        acc, l_i, m_i = _hopper_edges(acc, l_i, m_i, q, K, V, Mask, k_base, v_base, mask_base, b32, hk32,
                                      stride_kn, stride_vn, pos, offs_d, start_n, full_lo, full_hi, end_blk,
                                      sink_stop, window, sinks, S_k, qk_scale, CAUSAL, HAS_PAD, FOLD_SCALE, DESC,
                                      BLOCK_N, HEAD_DIM, SINK_N)
    if SINK_N > 0:  # 3) the sinks as one narrow block, after the loops (its buffers reuse theirs)
        if sink_stop > 0:
            acc, l_i, m_i = _hopper_sinks(acc, l_i, m_i, q, Kp, Vp, k_base, v_base, Mask, mask_base, stride_kn,
                                          stride_vn, offs_d, sink_stop, qk_scale, HAS_PAD, FOLD_SCALE, SINK_N)

    l_safe = tl.where(l_i > 0, l_i, 1.0)  # rows with no attended key -> zeros
    if RCP_EPILOGUE:  # one reciprocal per row, then a multiply per element (not a division per element)
        out = acc * (1.0 / l_safe)[:, None]
    else:
        out = acc / l_safe[:, None]
    if TMA_STORE:  # OutD: a descriptor over out [B, H, S_q, D]; rows past S_q are not written
        OutD.store([b32, h, first, 0], out.to(Kp.dtype.element_ty).reshape(1, 1, BLOCK_M, HEAD_DIM))
    else:
        o_base = b * stride_ob + h.to(tl.int64) * stride_oh
        o_ptrs = Out + o_base + rows[:, None] * stride_om + offs_d[None, :]
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=(rows < S_q)[:, None])


def sink_block_keys(sinks: int, block_n: int) -> int:
    """Keys in the narrow sink block (HopperVariant.sink_block): a power of two >= sinks, at least 16 (the
    smallest dot), at most BLOCK_N; 0 (the sinks stay in the edge loop) with no sinks or more than BLOCK_N."""
    if sinks <= 0 or sinks > block_n:
        return 0
    return min(block_n, max(16, 1 << (sinks - 1).bit_length()))


def descriptor_problem(arch: int, *tensors) -> str | None:
    """Why host TMA descriptors cannot be used for these [B, H, S, D] tensors (None: they can)."""
    import os

    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return "triton.tools.tensor_descriptor.TensorDescriptor is missing in this Triton"
    interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if arch < 90 and not interpret:
        return f"TMA needs sm_90 or newer, found sm_{arch}"
    for t in tensors:
        if t.stride(-1) != 1:
            return f"last dim must be contiguous, found strides {tuple(t.stride())}"
        if t.data_ptr() % 16:
            return f"base must be 16-byte aligned, found address % 16 = {t.data_ptr() % 16}"
        bad = [s for s in t.stride()[:-1] if (s * t.element_size()) % 16]
        if bad:
            return f"strides must be multiples of 16 bytes, found {tuple(t.stride())} x {t.element_size()} B"
    return None


def hopper_prefill(q, k, v, window, *, sinks=0, causal=True, scale=0.0, key_padding_mask=None,
                   tile: tuple[int, int, int, int] | None = None, variant: HopperVariant = HopperVariant(),
                   arch: int | None = None):
    """Run `_windowed_fwd_hopper_kernel`. q: [B, H, S_q, D]; k, v: [B, H_kv, S_k, D]; window: int tensor [].

    tile: (BLOCK_M, BLOCK_N, num_warps, num_stages), default `tuning.prefill_tile`. variant: the kernel's
    options; `desc=True` falls back to plain loads, with a warning saying why, when `descriptor_problem`
    finds one; `persistent` > 0 runs prefill_persistent.py's kernel where it applies (descriptors usable,
    causal, no padding; otherwise this kernel). arch: the device's compute capability (default: read from
    q's device). scale 0: 1/sqrt(D).
    """
    import torch

    q, k, v = (last_dim_contiguous(t) for t in (q, k, v))
    b, h, s_q, d = q.shape
    h_kv, s_k = k.shape[1], k.shape[2]
    arch = device_arch(q.device) if arch is None else arch
    bm, bn, warps, stages = tile or prefill_tile(arch, d)
    mask = mask_argument(key_padding_mask, window)
    has_pad = key_padding_mask is not None
    use_desc = variant.desc
    if use_desc:
        reason = descriptor_problem(arch, q, k, v)
        if reason is not None:
            import warnings

            warnings.warn(f"windowed_prefill: tensor descriptors off, plain loads instead: {reason}", stacklevel=3)
            use_desc = False
    if variant.persistent and use_desc:
        problem = persistent_problem(q, k, v, causal=causal, key_padding_mask=key_padding_mask, sinks=int(sinks),
                                     tile=(bm, bn))
        if problem is None:
            sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 1
            return persistent_prefill(q, k, v, window, sinks=int(sinks), scale=scale, tile=(bm, bn, warps, stages),
                                      programs_per_sm=variant.persistent, stages=int(variant.loop_stages or stages),
                                      sms=sms, edge_masks=variant.edge_masks)
    out = torch.empty_like(q)  # out: [B, H, S_q, D]
    qa, ka, va, oa = q, k, v, out
    if use_desc:
        from triton.tools.tensor_descriptor import TensorDescriptor

        # 4-D over [B, H(kv), S, D], one head's rows per block: rows past S read as zeros
        qa = TensorDescriptor(q, list(q.shape), list(q.stride()), [1, 1, bm, d])
        ka = TensorDescriptor(k, list(k.shape), list(k.stride()), [1, 1, bn, d])
        va = TensorDescriptor(v, list(v.shape), list(v.stride()), [1, 1, bn, d])
        if variant.tma_store:
            oa = TensorDescriptor(out, list(out.shape), list(out.stride()), [1, 1, bm, d])
    sink_n = sink_block_keys(int(sinks), bn) if variant.sink_block else 0
    grid = (triton.cdiv(s_q, bm), b * h)
    _windowed_fwd_hopper_kernel[grid](
        qa, ka, va, k, v, window, mask, oa,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        mask.stride(0) if has_pad else 0,
        h, h // h_kv, s_q, s_k, int(sinks), float(scale or d ** -0.5),
        out,
        CAUSAL=bool(causal), HAS_PAD=has_pad, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, DESC=use_desc,
        FOLD_SCALE=bool(variant.fold_scale), LOOP_STAGES=int(variant.loop_stages or stages),
        WARP_SPEC=bool(variant.warp_specialize), SINK_N=sink_n,
        SPLIT=bool(variant.split_edges and variant.one_loop) and bool(causal) and not has_pad,
        ONE_LOOP=bool(variant.one_loop),
        RCP_EPILOGUE=bool(variant.rcp_epilogue), TMA_STORE=bool(variant.tma_store and use_desc),
        num_warps=warps, num_stages=stages,
    )
    return out


__all__ = ["descriptor_problem", "hopper_prefill", "sink_block_keys"]
