"""Split-K decode over a sinks + ring KV cache: `_cached_decode_split_kernel`, merged by decode.py's reduce kernel.

One new token per stream, already written into its row (edgeattn.attention.ring). Per (stream, kv head) the
keys read are the sink rows j < min(sinks, P) (scored with q_sink, the query rotated for the sinks) and the
window positions max(P + 1 - W, min(sinks, P)) .. P, the new token included (scored with q, as the op scores
a chunk's own keys): at most sinks + W rows, whatever the cache's size. That list is split across SPLITS programs, sized on the host from the live window
(`cached_decode_splits`), not from the cache length, so a smaller window launches less work. Each stream has
its own position P (continuous batching). Reads top to bottom: the kernel, the split count, the launch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgeattn.plugins.kernels.common import LOG2E, NEG_BIG, decode_step, load_rows
from edgeattn.plugins.kernels.decode import _windowed_decode_reduce_kernel, merge_splits
from edgeattn.plugins.kernels.dependent_launch import dependent_start
from edgeattn.plugins.kernels.launch import last_dim_contiguous
from edgeattn.plugins.kernels.tuning import DECODE_BLOCK_N, decode_splits

INTERPRETER_SMS = 4


@triton.jit
def _ring_blocks(acc, l_i, m_i, q, K, V, kv_base, stride_kn, stride_vn, offs_d,
                 u0, u1, count, first_pos, sinks, wmax, qk_scale, IS_SINK: tl.constexpr, BLOCK_N: tl.constexpr):
    """Online softmax over virtual keys [u0, u1) of one group (sinks, or ring positions first_pos + u)."""
    for start in range(u0, u1, BLOCK_N):
        u = start + tl.arange(0, BLOCK_N)
        live = u < count
        if IS_SINK:
            rows = u
        else:
            p = first_pos + u
            rows = tl.where(p < sinks, p, sinks + (p - sinks) % wmax)
        rows = tl.where(live, rows, 0).to(tl.int64)
        k = load_rows(K, kv_base, rows, live, offs_d, stride_kn)
        v = load_rows(V, kv_base, rows, live, offs_d, stride_vn)
        acc, l_i, m_i = decode_step(acc, l_i, m_i, q, k, v, live, qk_scale)
    return acc, l_i, m_i


@triton.jit
def _cached_decode_split_kernel(
    Q, QS, K, V, Pos, Window,
    stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vn,
    H_kv, GROUP, C, sinks, sm_scale,
    PartO, PartM, PartL, Out, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
    USE_PDL: tl.constexpr = False, Counter=None, LAST_MERGES: tl.constexpr = False,
):
    # q, q_sink: [B, H, 1, D]; k, v: [B, H_kv, C, D] (the new token already written); pos: [B] int64 (tokens
    # before this one); window: [] int64 (0 or > C - sinks: the whole ring)
    # part_o: [B*H_kv, SPLITS, BLOCK_M, D] fp32; part_m, part_l: [B*H_kv, SPLITS, BLOCK_M]; grid (SPLITS, B*H_kv)
    # SPLITS == 1: no partials, the program writes out [B, H, 1, D] itself (one launch instead of two)
    # USE_PDL: launched as a programmatic dependent of the kernel that wrote q and the new rows (dependent_launch.py)
    # LAST_MERGES (SPLITS > 1): the last split program of each (b, kv head) to finish merges the partials itself
    # (counter: [B*H_kv] int32, zeros, left zeros), so no reduce kernel is launched
    dependent_start(USE_PDL)
    split = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H_kv).to(tl.int64)
    hk = (pid_bh % H_kv).to(tl.int64)
    wmax = C - sinks
    w = tl.load(Window).to(tl.int32)
    w = tl.where((w <= 0) | (w > wmax), wmax, w)
    t = tl.load(Pos + b).to(tl.int32)  # the new token's position
    n_sink = tl.minimum(sinks, t)  # sinks cached before this token: read with q_sink
    first_pos = tl.maximum(t + 1 - w, n_sink)  # window keys: positions [first_pos, t], the new token included
    n_ring = t + 1 - first_pos
    qk_scale = sm_scale * LOG2E

    r = tl.arange(0, BLOCK_M)  # row = head in group
    valid = r < GROUP
    head = hk * GROUP + r
    offs_d = tl.arange(0, HEAD_DIM)
    q_off = b * stride_qb + head[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(Q + q_off, mask=valid[:, None], other=0.0)  # q: [BLOCK_M, D]
    qs = tl.load(QS + q_off, mask=valid[:, None], other=0.0)

    # blocks: the sink blocks, then the ring blocks; this split takes [t0, t1)
    nsb = tl.cdiv(n_sink, BLOCK_N)
    total = nsb + tl.cdiv(n_ring, BLOCK_N)
    per = tl.cdiv(total, SPLITS)
    t0 = tl.minimum(split * per, total)
    t1 = tl.minimum(t0 + per, total)
    kv_base = b * stride_kb + hk * stride_kh
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + NEG_BIG
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    acc, l_i, m_i = _ring_blocks(acc, l_i, m_i, qs, K, V, kv_base, stride_kn, stride_vn, offs_d,
                                 tl.minimum(t0, nsb) * BLOCK_N, tl.minimum(t1, nsb) * BLOCK_N, n_sink, 0,
                                 sinks, wmax, qk_scale, True, BLOCK_N)
    acc, l_i, m_i = _ring_blocks(acc, l_i, m_i, q, K, V, kv_base, stride_kn, stride_vn, offs_d,
                                 (tl.maximum(t0, nsb) - nsb) * BLOCK_N, (tl.maximum(t1, nsb) - nsb) * BLOCK_N,
                                 n_ring, first_pos, sinks, wmax, qk_scale, False, BLOCK_N)
    if SPLITS == 1:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(Out + b * stride_ob + head[:, None] * stride_oh + offs_d[None, :], out.to(Out.dtype.element_ty),
                 mask=valid[:, None])
    else:
        part = (pid_bh.to(tl.int64) * SPLITS + split) * BLOCK_M
        tl.store(PartO + (part + r[:, None]) * HEAD_DIM + offs_d[None, :], acc)
        tl.store(PartM + part + r, m_i)
        tl.store(PartL + part + r, l_i)
        if LAST_MERGES:
            tl.debug_barrier()  # every thread's partials stored before the count says so
            done = tl.atomic_add(Counter + pid_bh, 1, sem="acq_rel")
            if done == SPLITS - 1:  # the others' partials are visible (acquire): merge, as the reduce kernel does
                s = tl.arange(0, SPLITS)
                for g in range(GROUP):
                    o = merge_splits(PartO, PartM, PartL, (pid_bh.to(tl.int64) * SPLITS + s) * BLOCK_M + g,
                                     offs_d, HEAD_DIM, True)
                    tl.store(Out + b * stride_ob + (hk * GROUP + g) * stride_oh + offs_d, o.to(Out.dtype.element_ty))
                tl.atomic_xchg(Counter + pid_bh, 0, sem="relaxed")  # ready for the next layer and step


MIN_BLOCKS_PER_SPLIT = 4  # below this a split's work is shorter than the launch of the reduce kernel
# At least two programs an SM where the window allows: one wave of one program an SM leaves the memory system idle.
# H200, batch 64 (192 stream x kv-head pairs), context 8,192, W = 1,024: 2 splits 1.64 ms a step against 1.79 for
# 1 (fused; linked 1.64 against 1.87); at W = 256 the cap keeps 1 (2 splits were slower there: 1.17 against 1.14).
PROGRAMS_PER_SM = 2


def cached_decode_splits(batch_kv_heads: int, sinks: int, window_keys: int, sms: int) -> int:
    """Splits per kv head from the keys the live window reads (sinks + W), not from the cache length: enough for a
    wave of programs and two programs an SM, at most a quarter of the key blocks, so a small window gets one split
    (no merge) and its decode is one launch."""
    keys = max(sinks + window_keys, 1)
    blocks = -(-keys // DECODE_BLOCK_N)
    cap = 1 << (max(blocks // MIN_BLOCKS_PER_SPLIT, 1).bit_length() - 1)  # a power of two <= blocks / 4
    busy = -(-PROGRAMS_PER_SM * sms // batch_kv_heads)
    busy = 1 << (busy.bit_length() - 1)  # a power of two <= what gives every SM two programs
    return min(max(decode_splits(batch_kv_heads, keys, sms), busy), cap)


def cached_decode(q, q_sink, k_cache, v_cache, positions, window, *, sinks: int, scale: float = 0.0,
                  window_keys: int | None = None, splits: int | None = None, pdl: bool = False, counter=None):
    """q, q_sink: [B, H, 1, D]; k_cache, v_cache: [B, H_kv, C, D] holding the new token at its row; positions:
    [B] int64 (tokens before the new one); window: [] int64 tensor on the device. window_keys: the ring rows the
    live window reads at most (the host's min(W, longest stream)); it sizes the split count (default: the ring).
    pdl: launch both kernels as programmatic dependents (Hopper and newer; dependent_launch.py). counter: [>= B*H_kv]
    int32 zeros on the device (left zeros): the last split program of each kv head merges the partials, one launch
    instead of two (a decode step passes one counter to all its layers). Returns [B, H, 1, D]."""
    import torch

    q, q_sink, k_cache, v_cache = (last_dim_contiguous(t) for t in (q, q_sink, k_cache, v_cache))
    b, h, s_q, d = q.shape
    if s_q != 1:
        raise ValueError(f"cached_decode: expected one query per stream, found S_q = {s_q}")
    h_kv, c = k_cache.shape[1], k_cache.shape[2]
    group = h // h_kv
    block_m = max(16, triton.next_power_of_2(group))  # tl.dot needs >= 16 rows
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else INTERPRETER_SMS
    keys = c - sinks if window_keys is None else window_keys
    n_split = splits or cached_decode_splits(b * h_kv, sinks, keys, sms)
    parts = (b * h_kv, n_split, block_m) if n_split > 1 else (1, 1, 1)  # SPLITS 1 writes `out` directly
    part_o = torch.empty((*parts, d), device=q.device, dtype=torch.float32)
    part_m = torch.empty(parts, device=q.device, dtype=torch.float32)
    part_l = torch.empty_like(part_m)
    out = torch.empty_like(q)  # out: [B, H, 1, D]
    dependent = {"USE_PDL": True, "launch_pdl": True} if pdl else {}
    merges = counter is not None and n_split > 1
    _cached_decode_split_kernel[(n_split, b * h_kv)](
        q, q_sink, k_cache, v_cache, positions, window,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(2),
        h_kv, group, c, int(sinks), float(scale or d ** -0.5),
        part_o, part_m, part_l, out, out.stride(0), out.stride(1),
        HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=DECODE_BLOCK_N, SPLITS=n_split, num_warps=4, num_stages=2,
        **dependent, **({"Counter": counter, "LAST_MERGES": True} if merges else {}),
    )
    if n_split == 1 or merges:
        return out
    _windowed_decode_reduce_kernel[(b * h_kv, group)](
        part_o, part_m, part_l, out.stride(0), out.stride(1), out.stride(2), h_kv, group, 1, out,
        HEAD_DIM=d, BLOCK_M=block_m, SPLITS=n_split, num_warps=4, **dependent,
    )
    return out


__all__ = ["cached_decode", "cached_decode_splits"]
