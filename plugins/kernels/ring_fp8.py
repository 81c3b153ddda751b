"""Split-K decode over an FP8 E4M3 sinks + ring KV cache: cached_decode.py's kernel with FP8 key and value loads.

Each (layer, kv head) has one key scale and one value scale (fixed at calibration: runtime/cuda/fp8_cache.py);
a cached row holds k / k_scale and v / v_scale in float8_e4m3fn. A program owns one kv head, so the scales are
two scalars: the key scale folds into the score scale and the value scale multiplies the accumulator once at
the end (partials included: the reduce kernel's merge is linear in them). Loads are half the bytes of bf16.
The merge of the splits is decode.py's reduce kernel, unchanged.

`torch.ops.edgeattn.ring_attend_fp8` wraps it like ring_ops.ring_attend (the caller has written the new rows);
other devices run the float reference on the dequantized cache.
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgeattn.optional import require
from edgeattn.plugins.kernels.common import LOG2E, NEG_BIG, decode_step, load_rows
from edgeattn.plugins.kernels.decode import _windowed_decode_reduce_kernel
from edgeattn.plugins.kernels.launch import last_dim_contiguous
from edgeattn.plugins.kernels.tuning import DECODE_BLOCK_N

torch = require("torch", "the edgeattn FP8 ring decode op")

INTERPRETER_SMS = 4
# the sink rows' block: a few rows read in tiles of 16 (the smallest tl.dot), not in the ring's tiles, so the loop
# over a float sink buffer adds no registers to the FP8 loop's (at head_dim 128 a 128-row sink tile made the
# kernel 1.66x slower on the H200)
SINK_BLOCK = tl.constexpr(16)
# (BLOCK_N, num_warps, num_stages) of the FP8 kernel on the H200 (benchmarks/fp8_h200.py `kernel` sweeps it)
FP8_TILE = (128, 4, 3)  # measured: 1.56x bf16 at batch 64, 8,192 rows (9/3 heads, D 64)
OP_NAME = "edgeattn::ring_attend_fp8"


@triton.jit
def _ring_blocks_fp8(acc, l_i, m_i, q, K, V, kv_base, stride_kn, stride_vn, offs_d,
                     u0, u1, count, first_pos, sinks, wmax, qk_scale, IS_SINK: tl.constexpr, BLOCK_N: tl.constexpr):
    """cached_decode._ring_blocks with FP8 K and V widened to fp16 (exact: every E4M3 value is an fp16 value; one
    conversion instruction per pair), q in fp16; qk_scale carries the key scale."""
    for start in range(u0, u1, BLOCK_N):
        u = start + tl.arange(0, BLOCK_N)
        live = u < count
        if IS_SINK:
            rows = u
        else:
            p = first_pos + u
            rows = tl.where(p < sinks, p, sinks + (p - sinks) % wmax)
        rows = tl.where(live, rows, 0).to(tl.int64)
        k = load_rows(K, kv_base, rows, live, offs_d, stride_kn).to(tl.float16)
        v = load_rows(V, kv_base, rows, live, offs_d, stride_vn).to(tl.float16)
        acc, l_i, m_i = decode_step(acc, l_i, m_i, q, k, v, live, qk_scale)
    return acc, l_i, m_i


@triton.jit
def _ring_fp8_split_kernel(
    Q, QS, K, V, KS, VS, Pos, Window, SK, SV,
    stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vn, stride_sb, stride_sh, stride_sn,
    H_kv, GROUP, C, sinks, sm_scale,
    PartO, PartM, PartL, Out, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
):
    # as cached_decode._cached_decode_split_kernel; k, v: [B, H_kv, C, D] float8_e4m3fn; ks, vs: [H_kv] fp32;
    # sk, sv: the sink rows (x / scale, any float type, or the FP8 cache itself), strides stride_s*
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
    qk_scale = sm_scale * LOG2E * tl.load(KS + hk)
    v_scale = tl.load(VS + hk)

    r = tl.arange(0, BLOCK_M)
    valid = r < GROUP
    head = hk * GROUP + r
    offs_d = tl.arange(0, HEAD_DIM)
    q_off = b * stride_qb + head[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(Q + q_off, mask=valid[:, None], other=0.0).to(tl.float16)  # q: [BLOCK_M, D]
    qs = tl.load(QS + q_off, mask=valid[:, None], other=0.0).to(tl.float16)

    nsb = tl.cdiv(n_sink, BLOCK_N)
    total = nsb + tl.cdiv(n_ring, BLOCK_N)
    per = tl.cdiv(total, SPLITS)
    t0 = tl.minimum(split * per, total)
    t1 = tl.minimum(t0 + per, total)
    kv_base = b * stride_kb + hk * stride_kh
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + NEG_BIG
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    acc, l_i, m_i = _ring_blocks_fp8(acc, l_i, m_i, qs, SK, SV, b * stride_sb + hk * stride_sh, stride_sn,
                                     stride_sn, offs_d,
                                     tl.minimum(t0, nsb) * BLOCK_N, tl.minimum(tl.minimum(t1, nsb) * BLOCK_N, n_sink),
                                     n_sink, 0, sinks, wmax, qk_scale, True, SINK_BLOCK)
    acc, l_i, m_i = _ring_blocks_fp8(acc, l_i, m_i, q, K, V, kv_base, stride_kn, stride_vn, offs_d,
                                     (tl.maximum(t0, nsb) - nsb) * BLOCK_N, (tl.maximum(t1, nsb) - nsb) * BLOCK_N,
                                     n_ring, first_pos, sinks, wmax, qk_scale, False, BLOCK_N)
    acc = acc * v_scale
    if SPLITS == 1:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(Out + b * stride_ob + head[:, None] * stride_oh + offs_d[None, :], out.to(Out.dtype.element_ty),
                 mask=valid[:, None])
    else:
        part = (pid_bh.to(tl.int64) * SPLITS + split) * BLOCK_M
        tl.store(PartO + (part + r[:, None]) * HEAD_DIM + offs_d[None, :], acc)
        tl.store(PartM + part + r, m_i)
        tl.store(PartL + part + r, l_i)


def ring_decode_fp8(q, q_sink, k_cache, v_cache, k_scale, v_scale, positions, window, *, sinks: int,
                    scale: float = 0.0, splits: int | None = None, tile: tuple[int, int, int] | None = None,
                    k_sinks=None, v_sinks=None):
    """cached_decode.cached_decode over an FP8 cache: k_cache, v_cache [B, H_kv, C, D] float8_e4m3fn; k_scale,
    v_scale [H_kv] fp32; k_sinks, v_sinks: the sink rows kept in a float type ([B, H_kv, >= sinks, D], x / scale,
    fp8_cache.Layers), else the cache's own FP8 sink rows. `tile`: (BLOCK_N, num_warps, num_stages), FP8_TILE by
    default. Returns [B, H, 1, D] in q's dtype."""
    from edgeattn.plugins.kernels.cached_decode import cached_decode_splits

    q, q_sink, k_cache, v_cache = (last_dim_contiguous(t) for t in (q, q_sink, k_cache, v_cache))
    if (k_sinks is None) != (v_sinks is None):
        raise ValueError("ring_decode_fp8: expected both k_sinks and v_sinks or neither, found one")
    if k_sinks is None:
        k_sinks, v_sinks = k_cache, v_cache
    k_sinks, v_sinks = last_dim_contiguous(k_sinks), last_dim_contiguous(v_sinks)
    if k_sinks.stride() != v_sinks.stride() or k_sinks.shape[2] < sinks:
        raise ValueError(f"ring_decode_fp8: expected sink buffers of one layout holding >= {sinks} rows, found "
                         f"{tuple(k_sinks.shape)} strides {k_sinks.stride()} and {v_sinks.stride()}")
    b, h, s_q, d = q.shape
    if s_q != 1:
        raise ValueError(f"ring_decode_fp8: expected one query per stream, found S_q = {s_q}")
    if k_cache.dtype != torch.float8_e4m3fn or v_cache.dtype != torch.float8_e4m3fn:
        raise ValueError(f"ring_decode_fp8: expected float8_e4m3fn caches, found {k_cache.dtype}, {v_cache.dtype}")
    h_kv, c = k_cache.shape[1], k_cache.shape[2]
    group = h // h_kv
    block_m = max(16, triton.next_power_of_2(group))
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else INTERPRETER_SMS
    n_split = splits or cached_decode_splits(b * h_kv, sinks, c - sinks, sms)
    block_n, warps, stages = tile or FP8_TILE
    parts = (b * h_kv, n_split, block_m) if n_split > 1 else (1, 1, 1)
    part_o = torch.empty((*parts, d), device=q.device, dtype=torch.float32)
    part_m = torch.empty(parts, device=q.device, dtype=torch.float32)
    part_l = torch.empty_like(part_m)
    out = torch.empty_like(q)
    _ring_fp8_split_kernel[(n_split, b * h_kv)](
        q, q_sink, k_cache, v_cache, k_scale, v_scale, positions, window, k_sinks, v_sinks,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(2),
        k_sinks.stride(0), k_sinks.stride(1), k_sinks.stride(2),
        h_kv, group, c, int(sinks), float(scale or d ** -0.5),
        part_o, part_m, part_l, out, out.stride(0), out.stride(1),
        HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, SPLITS=n_split, num_warps=warps, num_stages=stages,
    )
    if n_split == 1:
        return out
    _windowed_decode_reduce_kernel[(b * h_kv, group)](
        part_o, part_m, part_l, out.stride(0), out.stride(1), out.stride(2), h_kv, group, 1, out,
        HEAD_DIM=d, BLOCK_M=block_m, SPLITS=n_split, num_warps=4,
    )
    return out


def dequantize_cache(cache, cache_scale, dtype):
    """[B, H_kv, C, D] FP8 rows -> `dtype`, times the per-head scale [H_kv]."""
    return (cache.float() * cache_scale.float()[None, :, None, None]).to(dtype)


def dequantize_with_sinks(cache, cache_scale, sink_rows, sinks: int, dtype):
    """dequantize_cache, the first `sinks` rows taken from `sink_rows` (x / scale in a float type) when given."""
    out = dequantize_cache(cache, cache_scale, dtype)
    if sink_rows is not None:
        out[:, :, :sinks] = dequantize_cache(sink_rows[:, :, :sinks], cache_scale, dtype)
    return out


@torch.library.custom_op(OP_NAME, mutates_args=())
def ring_attend_fp8(q: torch.Tensor, q_sink: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    k_scale: torch.Tensor, v_scale: torch.Tensor, positions: torch.Tensor, window: torch.Tensor,
                    sinks: int, scale: float, splits: int, k_sinks: torch.Tensor | None = None,
                    v_sinks: torch.Tensor | None = None) -> torch.Tensor:
    """ring_ops.ring_attend over an FP8 cache (the new rows already written), its sink rows from k_sinks /
    v_sinks when given. Reference for non-CUDA devices: the float attention over the dequantized cache."""
    from edgeattn.plugins.kernels.ring_ops import ring_attend

    b = q.shape[0]
    keys = dequantize_with_sinks(k_cache[:b], k_scale, None if k_sinks is None else k_sinks[:b], sinks, torch.float32)
    values = dequantize_with_sinks(v_cache[:b], v_scale, None if v_sinks is None else v_sinks[:b], sinks,
                                   torch.float32)
    return ring_attend(q.float(), q_sink.float(), keys, values, positions, window, sinks, scale, splits).to(q.dtype)


@ring_attend_fp8.register_kernel("cuda")
def _ring_attend_fp8_cuda(q, q_sink, k_cache, v_cache, k_scale, v_scale, positions, window, sinks, scale, splits,
                          k_sinks=None, v_sinks=None):
    b = q.shape[0]
    out = ring_decode_fp8(q[:, :, None], q_sink[:, :, None], k_cache[:b], v_cache[:b], k_scale, v_scale, positions,
                          window, sinks=sinks, scale=scale, splits=splits or None,
                          k_sinks=None if k_sinks is None else k_sinks[:b],
                          v_sinks=None if v_sinks is None else v_sinks[:b])
    return out[:, :, 0]


@ring_attend_fp8.register_fake
def _ring_attend_fp8_fake(q, q_sink, k_cache, v_cache, k_scale, v_scale, positions, window, sinks, scale, splits,
                          k_sinks=None, v_sinks=None):
    return torch.empty_like(q)


__all__ = ["OP_NAME", "dequantize_cache", "dequantize_with_sinks", "ring_attend_fp8", "ring_decode_fp8"]
