"""The split-K decode kernels (flash-decoding): `_windowed_decode_split_kernel` + `_windowed_decode_reduce_kernel`.

For few queries (S_q small, after a KV cache): the attended key blocks (sinks, then the window up to S_k)
are split across SPLITS programs per kv head; each program runs the online softmax over its share
(common.attend_blocks) for all GROUP = H / H_kv query heads of its kv head and all S_q queries (rows r =
head in group * S_q + query), so every K/V byte is read once. The reduce kernel merges the SPLITS partial
softmaxes of each row. Reads top to bottom: the two kernels, the public launch `windowed_decode`.

Kernel names, parameter order and constexprs are the contract of the AOT builds (aot.py): input
pointers, scalars (int32; sm_scale fp32), output pointers.
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgeattn.plugins.kernels.common import LOG2E, NEG_BIG, attend_blocks, effective_window
from edgeattn.plugins.kernels.dependent_launch import dependent_start
from edgeattn.plugins.kernels.launch import last_dim_contiguous, mask_argument
from edgeattn.plugins.kernels.tuning import DECODE_BLOCK_N, decode_splits

INTERPRETER_SMS = 4  # the wave decode_splits fills for CPU tensors (TRITON_INTERPRET=1)


@triton.jit
def _windowed_decode_split_kernel(
    Q, K, V, Window, Mask,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_mb,
    H_kv, GROUP, S_q, S_k,
    sinks, sm_scale,
    PartO, PartM, PartL,
    CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
):
    # q: [B, H, S_q, D]; k, v: [B, H_kv, S_k, D]; window: [] int64; mask: [B, S_k] int8 (HAS_PAD)
    # part_o: [B*H_kv, SPLITS, BLOCK_M, D] fp32; part_m, part_l: [B*H_kv, SPLITS, BLOCK_M] fp32
    # grid (SPLITS, B * H_kv)
    split = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H_kv).to(tl.int64)
    hk = (pid_bh % H_kv).to(tl.int64)
    window = effective_window(Window, S_k)
    qk_scale = sm_scale * LOG2E  # exp2 instead of exp

    r = tl.arange(0, BLOCK_M)  # row = (head in group) * S_q + query
    valid = r < GROUP * S_q
    head = hk * GROUP + (r // S_q)
    qi = r % S_q
    pos = qi + (S_k - S_q)  # queries are the last S_q positions
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptrs = Q + b * stride_qb + head[:, None] * stride_qh + qi[:, None] * stride_qm + offs_d[None, :]
    q = tl.load(q_ptrs, mask=valid[:, None], other=0.0)  # q: [BLOCK_M, D]

    # Attended key blocks t < n_total: the n_sink sink blocks below the window, then the window (from the
    # first query's left edge) up to S_k. This split takes blocks [t0, t1).
    lo = tl.maximum(S_k - S_q - window + 1, 0)
    start_n = (lo // BLOCK_N) * BLOCK_N
    n_sink = tl.cdiv(tl.minimum(sinks, start_n), BLOCK_N)
    n_total = n_sink + tl.cdiv(S_k - start_n, BLOCK_N)
    per = tl.cdiv(n_total, SPLITS)
    t0 = tl.minimum(split * per, n_total)
    t1 = tl.minimum(t0 + per, n_total)

    k_base = b * stride_kb + hk * stride_kh
    v_base = b * stride_vb + hk * stride_vh
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + NEG_BIG  # m_i, l_i: [BLOCK_M] running max and sum
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)  # acc: [BLOCK_M, D]
    s0 = tl.minimum(t0, n_sink) * BLOCK_N  # this split's sink blocks [s0, s1)
    s1 = tl.minimum(t1, n_sink) * BLOCK_N
    acc, l_i, m_i = attend_blocks(acc, l_i, m_i, q, K, V, Mask, k_base, v_base, b * stride_mb, stride_kn,
                                  stride_vn, pos, offs_d, s0, s1, window, sinks, S_k, qk_scale,
                                  True, CAUSAL, HAS_PAD, BLOCK_N)
    w0 = start_n + (tl.maximum(t0, n_sink) - n_sink) * BLOCK_N  # this split's window blocks [w0, w1)
    w1 = start_n + (tl.maximum(t1, n_sink) - n_sink) * BLOCK_N
    acc, l_i, m_i = attend_blocks(acc, l_i, m_i, q, K, V, Mask, k_base, v_base, b * stride_mb, stride_kn,
                                  stride_vn, pos, offs_d, w0, w1, window, sinks, S_k, qk_scale,
                                  True, CAUSAL, HAS_PAD, BLOCK_N)

    part = (pid_bh.to(tl.int64) * SPLITS + split) * BLOCK_M
    tl.store(PartO + (part + r[:, None]) * HEAD_DIM + offs_d[None, :], acc)
    tl.store(PartM + part + r, m_i)
    tl.store(PartL + part + r, l_i)


@triton.jit
def merge_splits(PartO, PartM, PartL, part, offs_d, HEAD_DIM: tl.constexpr, FRESH: tl.constexpr):
    """One row's attention output [D] (float32) from its SPLITS partial softmaxes at offsets part [SPLITS] (rows of
    PartO [*, D], PartM, PartL; m in the log2 domain). FRESH: read around L1 (partials another program of the
    same launch has just written)."""
    if FRESH:
        m = tl.load(PartM + part, cache_modifier=".cg")
        l = tl.load(PartL + part, cache_modifier=".cg")
        o = tl.load(PartO + part[:, None] * HEAD_DIM + offs_d[None, :], cache_modifier=".cg")
    else:
        m = tl.load(PartM + part)  # m, l: [SPLITS]
        l = tl.load(PartL + part)
        o = tl.load(PartO + part[:, None] * HEAD_DIM + offs_d[None, :])  # o: [SPLITS, D]
    m_all = tl.max(m, 0)
    w = tl.math.exp2(m - m_all)
    l_all = tl.sum(l * w, 0)
    acc = tl.sum(o * w[:, None], 0)
    return acc / tl.where(l_all > 0, l_all, 1.0)  # a row with no attended key -> zeros


@triton.jit
def _windowed_decode_reduce_kernel(
    PartO, PartM, PartL,
    stride_ob, stride_oh, stride_om,
    H_kv, GROUP, S_q,
    Out,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, SPLITS: tl.constexpr, USE_PDL: tl.constexpr = False,
):
    # one program per (b, kv head, row); combines the SPLITS partial softmaxes of that row
    # grid (B * H_kv, GROUP * S_q); out: [B, H, S_q, D]; USE_PDL: a programmatic dependent (dependent_launch.py)
    dependent_start(USE_PDL)
    pid_bh = tl.program_id(0)
    r = tl.program_id(1)
    b = (pid_bh // H_kv).to(tl.int64)
    hk = (pid_bh % H_kv).to(tl.int64)
    s = tl.arange(0, SPLITS)
    offs_d = tl.arange(0, HEAD_DIM)
    part = (pid_bh.to(tl.int64) * SPLITS + s) * BLOCK_M + r  # [SPLITS]
    out = merge_splits(PartO, PartM, PartL, part, offs_d, HEAD_DIM, False)
    head = hk * GROUP + r // S_q
    qi = r % S_q
    tl.store(Out + b * stride_ob + head * stride_oh + qi * stride_om + offs_d, out.to(Out.dtype.element_ty))


def windowed_decode(q, k, v, window, *, sinks=0, causal=True, scale=0.0, key_padding_mask=None,
                    splits: int | None = None, window_hint: int | None = None):
    """Decode path (S_q small): split-K over the sinks + window blocks, then a reduction.

    q: [B, H, S_q, D]; k, v: [B, H_kv, S_k, D]; window: int tensor []. (H / H_kv) * S_q rows per kv head,
    at most 64 in `windowed_attention`. splits: programs per kv head (default `tuning.decode_splits`: one
    wave of the GPU's SMs). scale 0: 1/sqrt(D).
    """
    import torch

    q, k, v = (last_dim_contiguous(t) for t in (q, k, v))
    b, h, s_q, d = q.shape
    h_kv, s_k = k.shape[1], k.shape[2]
    group = h // h_kv
    block_m = max(16, triton.next_power_of_2(group * s_q))  # tl.dot needs >= 16 rows
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else INTERPRETER_SMS
    keys = s_k if not window_hint or window_hint >= s_k else min(s_k, window_hint + s_q - 1 + int(sinks))
    n_split = splits or decode_splits(b * h_kv, keys, sms)
    # part_o: [B*H_kv, SPLITS, BLOCK_M, D], part_m / part_l: [B*H_kv, SPLITS, BLOCK_M]: each split's partial
    # output, running max (log2 domain) and sum, fp32
    part_o = torch.empty((b * h_kv, n_split, block_m, d), device=q.device, dtype=torch.float32)
    part_m = torch.empty((b * h_kv, n_split, block_m), device=q.device, dtype=torch.float32)
    part_l = torch.empty_like(part_m)
    out = torch.empty_like(q)  # out: [B, H, S_q, D]
    mask = mask_argument(key_padding_mask, window)
    _windowed_decode_split_kernel[(n_split, b * h_kv)](
        q, k, v, window, mask,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        mask.stride(0) if key_padding_mask is not None else 0,
        h_kv, group, s_q, s_k, int(sinks), float(scale or d ** -0.5),
        part_o, part_m, part_l,
        CAUSAL=bool(causal), HAS_PAD=key_padding_mask is not None, HEAD_DIM=d,
        BLOCK_M=block_m, BLOCK_N=DECODE_BLOCK_N, SPLITS=n_split, num_warps=4, num_stages=3,
    )
    _windowed_decode_reduce_kernel[(b * h_kv, group * s_q)](
        part_o, part_m, part_l, out.stride(0), out.stride(1), out.stride(2), h_kv, group, s_q, out,
        HEAD_DIM=d, BLOCK_M=block_m, SPLITS=n_split, num_warps=4,
    )
    return out


__all__ = ["windowed_decode"]
