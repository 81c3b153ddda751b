"""The prefill / encoder kernel (`_windowed_fwd_kernel`): the one the AOT builds and TensorRT plugins ship.

FlashAttention-2 style online softmax, one program per (query tile, batch x head). It visits only the
key blocks inside the tile's window plus the sink blocks left of it (work ~ S_q x (W + sinks)), and
without padding only edge blocks pay for the mask. The window is read from a device tensor, so a new
window needs no recompile and no host sync. Reads top to bottom: the inner loop (one_loop=False runs
common.attend_blocks per region instead), the kernel, the public launch `default_prefill`.
`dispatch.windowed_prefill` picks this kernel or the sm_90 one (prefill_hopper.py).

The kernel's name, parameter order and constexprs are the contract of the AOT builds (aot.py) and the
TensorRT plugins: input pointers, scalars (int32; sm_scale fp32), output pointer.
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgeattn.plugins.kernels.common import (NEG_BIG, attend_blocks, dot, key_allowed, key_blocks, load_block,
                                             query_tile, softmax_update)
from edgeattn.plugins.kernels.launch import device_arch, last_dim_contiguous, mask_argument
from edgeattn.plugins.kernels.tuning import prefill_tile


@triton.jit
def _attend_one_loop(acc, l_i, m_i, q, K, V, Mask, k_base, v_base, mask_base, stride_kn, stride_vn,
                     pos, offs_d, n_sink, start_n, n_total, full_lo, full_hi, window, sinks, S_k, qk_scale,
                     CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                     USE_TMA: tl.constexpr):
    # One software-pipelined loop over blocks t < n_total: the n_sink sink blocks first, then the window's
    # blocks from start_n. Without padding only edge blocks (outside [full_lo, full_hi)) pay for the
    # mask; with padding every block does. q: [BLOCK_M, D]; acc: [BLOCK_M, D] fp32
    for t in range(0, n_total):
        start = tl.where(t < n_sink, t * BLOCK_N, start_n + (t - n_sink) * BLOCK_N)
        offs_n = start + tl.arange(0, BLOCK_N)  # absolute key positions
        k = load_block(K, k_base, start, offs_n, offs_d, stride_kn, S_k, True, USE_TMA)  # k: [BLOCK_N, D]
        qk = dot(q, tl.trans(k))  # qk: [BLOCK_M, BLOCK_N] fp32, unscaled
        if HAS_PAD:
            real = tl.load(Mask + mask_base + offs_n, mask=offs_n < S_k, other=0)
            ok = key_allowed(pos, offs_n, window, sinks, S_k, CAUSAL) & (real != 0)[None, :]
            qk = tl.where(ok, qk, float("-inf"))
        else:
            if (start < full_lo) | (start >= full_hi):
                qk = tl.where(key_allowed(pos, offs_n, window, sinks, S_k, CAUSAL), qk, float("-inf"))
        acc, l_i, m_i = softmax_update(acc, l_i, m_i, qk, qk_scale, V, v_base, start, offs_n, offs_d, stride_vn, S_k,
                                       True, USE_TMA)
    return acc, l_i, m_i


@triton.jit
def _windowed_fwd_kernel(
    Q, K, V, Window, Mask,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om,
    stride_mb,
    H, GROUP, S_q, S_k,
    sinks, sm_scale,
    Out,
    CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr = False,
    ONE_LOOP: tl.constexpr = True,
):
    # q, out: [B, H, S_q, D]; k, v: [B, H_kv, S_k, D]; window: [] int64; mask: [B, S_k] int8 (HAS_PAD)
    b, h, hk, window, qk_scale, first, rows, pos, p_min, p_max = query_tile(Window, H, GROUP, S_q, S_k,
                                                                            sm_scale, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)

    q_ptrs = Q + b * stride_qb + h.to(tl.int64) * stride_qh + rows[:, None] * stride_qm + offs_d[None, :]
    q = tl.load(q_ptrs, mask=(rows < S_q)[:, None], other=0.0)  # q: [BLOCK_M, D]
    k_base = b * stride_kb + hk * stride_kh
    v_base = b * stride_vb + hk * stride_vh
    mask_base = b * stride_mb
    Kt, Vt = K, V
    if USE_TMA:  # in-kernel Hopper descriptors over this head's [S_k, D]: the tail block reads zeros
        Kt = tl.make_tensor_descriptor(K + k_base, shape=[S_k, HEAD_DIM], strides=[stride_kn, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
        Vt = tl.make_tensor_descriptor(V + v_base, shape=[S_k, HEAD_DIM], strides=[stride_vn, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
    start_n, end_blk, full_lo, full_hi, sink_stop = key_blocks(p_min, p_max, window, sinks, S_k, CAUSAL, BLOCK_N)

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + NEG_BIG  # m_i, l_i: [BLOCK_M] running max and sum
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)  # acc: [BLOCK_M, D]
    if ONE_LOOP:
        n_sink = tl.cdiv(sink_stop, BLOCK_N)
        n_total = n_sink + (end_blk - start_n) // BLOCK_N
        acc, l_i, m_i = _attend_one_loop(acc, l_i, m_i, q, Kt, Vt, Mask, k_base, v_base, mask_base, stride_kn,
                                         stride_vn, pos, offs_d, n_sink, start_n, n_total, full_lo, full_hi,
                                         window, sinks, S_k, qk_scale, CAUSAL, HAS_PAD, BLOCK_N, USE_TMA)
    else:
        # 1) sinks left of the window, 2) window's left edge, 3) the band (no mask), 4) diagonal / right edge
        acc, l_i, m_i = attend_blocks(acc, l_i, m_i, q, Kt, Vt, Mask, k_base, v_base, mask_base, stride_kn,
                                      stride_vn, pos, offs_d, 0, sink_stop, window, sinks, S_k, qk_scale,
                                      True, CAUSAL, HAS_PAD, BLOCK_N, USE_TMA)
        acc, l_i, m_i = attend_blocks(acc, l_i, m_i, q, Kt, Vt, Mask, k_base, v_base, mask_base, stride_kn,
                                      stride_vn, pos, offs_d, start_n, full_lo, window, sinks, S_k, qk_scale,
                                      True, CAUSAL, HAS_PAD, BLOCK_N, USE_TMA)
        acc, l_i, m_i = attend_blocks(acc, l_i, m_i, q, Kt, Vt, Mask, k_base, v_base, mask_base, stride_kn,
                                      stride_vn, pos, offs_d, full_lo, full_hi, window, sinks, S_k, qk_scale,
                                      False, CAUSAL, HAS_PAD, BLOCK_N, USE_TMA)
        acc, l_i, m_i = attend_blocks(acc, l_i, m_i, q, Kt, Vt, Mask, k_base, v_base, mask_base, stride_kn,
                                      stride_vn, pos, offs_d, full_hi, end_blk, window, sinks, S_k, qk_scale,
                                      True, CAUSAL, HAS_PAD, BLOCK_N, USE_TMA)

    l_safe = tl.where(l_i > 0, l_i, 1.0)  # rows with no attended key -> zeros
    out = acc / l_safe[:, None]
    o_ptrs = Out + b * stride_ob + h.to(tl.int64) * stride_oh + rows[:, None] * stride_om + offs_d[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=(rows < S_q)[:, None])


def _set_tma_allocator(device) -> None:
    """In-kernel tensor descriptors need a small global scratch buffer from Triton's allocator."""
    import torch

    def alloc(size: int, alignment: int, stream):
        return torch.empty(size, dtype=torch.int8, device=device)

    triton.set_allocator(alloc)


def default_prefill(q, k, v, window, *, sinks=0, causal=True, scale=0.0, key_padding_mask=None,
                    tile: tuple[int, int, int, int] | None = None, use_tma: bool = False, one_loop: bool = True):
    """Run `_windowed_fwd_kernel`. q: [B, H, S_q, D]; k, v: [B, H_kv, S_k, D]; window: int tensor [].

    tile: (BLOCK_M, BLOCK_N, num_warps, num_stages), default `tuning.prefill_tile`. use_tma: load K/V with
    in-kernel Hopper tensor descriptors (sm_90+; needs Triton's scratch allocator). one_loop: one
    pipelined loop over all key blocks rather than one loop per region. scale 0: 1/sqrt(D).
    """
    import torch

    q, k, v = (last_dim_contiguous(t) for t in (q, k, v))
    b, h, s_q, d = q.shape
    h_kv, s_k = k.shape[1], k.shape[2]
    bm, bn, warps, stages = tile or prefill_tile(device_arch(q.device), d)
    out = torch.empty_like(q)  # out: [B, H, S_q, D]
    if use_tma:
        _set_tma_allocator(q.device)
    mask = mask_argument(key_padding_mask, window)
    grid = (triton.cdiv(s_q, bm), b * h)
    _windowed_fwd_kernel[grid](
        q, k, v, window, mask,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        mask.stride(0) if key_padding_mask is not None else 0,
        h, h // h_kv, s_q, s_k, int(sinks), float(scale or d ** -0.5),
        out,
        CAUSAL=bool(causal), HAS_PAD=key_padding_mask is not None, HEAD_DIM=d,
        BLOCK_M=bm, BLOCK_N=bn, USE_TMA=bool(use_tma), ONE_LOOP=bool(one_loop), num_warps=warps, num_stages=stages,
    )
    return out


__all__ = ["default_prefill"]
