"""Triton kernels for edgeattn::WindowedAttention (docs/windowed-attention.md, docs/kernels.md).

Reads top to bottom: the inner loop over key blocks, the prefill kernel (skips every key block outside
the window and the sinks: work ~ S_q x (W + sinks)), the split-K decode kernel and its reduction, the
launch wrappers, and the public `windowed_attention`.

The window is read from a device tensor inside the kernels, so a new window needs no recompile and no
host sync. Scores live in the log2 domain (`qk * scale / ln 2`) so that softmax uses exp2.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # 1 / ln 2
# A finite "minus infinity" for the running max: a row that has seen only masked keys keeps it, and
# exp2(NEG_BIG - NEG_BIG) = 1 rather than NaN. Masked scores themselves are -inf (weight exactly 0).
NEG_BIG = tl.constexpr(-1.0e30)

# Tile shapes per (compute capability, head dim): BLOCK_M, BLOCK_N, num_warps, num_stages. sm_90: the
# winners of the H200 sweep in benchmarks/attention_h200.py (docs/kernels.md; 64x64 tiles waste the least
# work at the window's edges and tied the larger tiles at full window). sm_87 / sm_110: not measured;
# conservative (Orin has 164 KiB of shared memory per SM, like sm_80).
PREFILL_TILES: dict[tuple[int, int], tuple[int, int, int, int]] = {
    (90, 64): (64, 64, 4, 3),
    (90, 128): (64, 64, 4, 3),
    (87, 64): (64, 64, 4, 3),
    (87, 128): (64, 64, 4, 2),
    (110, 64): (64, 64, 4, 3),
    (110, 128): (64, 64, 4, 3),
}
# Load K/V through Hopper tensor descriptors (TMA) in the JIT path: off, it lost to plain loads in the
# H200 sweep. AOT builds never use it (TensorRT launches give no scratch allocator; sm_87 has no TMA).
PREFILL_TMA: dict[int, bool] = {90: False}
# The prefill kernel windowed_prefill uses on CUDA when the caller passes no `hopper` (and no window_hint):
# None = _windowed_fwd_kernel, else HopperVariant fields for _windowed_fwd_hopper_kernel. Unchanged
# (None) until an H200 `attention_h200.py --sweep-hopper` run shows a variant winning.
PREFILL_HOPPER: dict[int, dict | None] = {90: {"desc": True}}  # H200 sweep 2026-11-29: 1.0-1.1x the default
# Per-window choices for the prefill kernel when the caller knows the window (windowed_prefill(...,
# window_hint=W)): (arch base, head dim) -> [(largest window it serves, 0 = any incl. full, tile,
# HopperVariant fields or None = the default kernel)], smallest window first. Empty until an H200
# `attention_h200.py --sweep-hopper` run fills it; then the default tile/kernel applies.
PREFILL_WINDOW_TABLE: dict[tuple[int, int], list[tuple[int, tuple[int, int, int, int], dict | None]]] = {
    # second H200 sweep, 2026-11-29 (benchmarks/results/attention_h200_sweep2_2026-11-29.log)
    (90, 64): [(256, (64, 64, 4, 2), {"desc": True}), (1024, (64, 64, 4, 2), {"desc": True, "loop_stages": 2}),
               (0, (64, 128, 4, 3), {"desc": True})],
    (90, 128): [(256, (64, 64, 4, 3), {"desc": True}), (1024, (64, 64, 4, 3), {"desc": True, "fold_scale": True}),
                (0, (128, 128, 8, 3), {"desc": True})],
}
DECODE_BLOCK_N = 64
DECODE_MAX_QUERIES = 16  # S_q at or below this (per kv head: group * S_q <= 64) takes the decode path


def prefill_tile(arch: int, head_dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for an arch (e.g. 90) and head dim."""
    base = 90 if arch >= 90 and arch != 110 else (110 if arch == 110 else 87)
    d = 64 if head_dim <= 64 else 128
    bm, bn, warps, stages = PREFILL_TILES[(base, d)]
    if head_dim > 128:  # 256: halve the tiles to fit shared memory
        bm, bn, stages = 64, 32, 2
    return bm, bn, warps, stages


@dataclass(frozen=True)
class HopperVariant:
    """Options of the opt-in sm_90 prefill kernel (_windowed_fwd_hopper_kernel).

    desc: host-built TMA tensor descriptors for Q, K, V (sm_90+, 16-byte aligned strides; otherwise plain
    loads, with a warning saying why). fold_scale: pre-scale q by scale / ln 2. loop_stages: software
    pipeline depth of the unmasked band loop (None: the tile's num_stages). warp_specialize: the band loop
    as `tl.range(..., warp_specialize=True)` (Triton >= 3.4 on Hopper/Blackwell).
    """

    desc: bool = False
    fold_scale: bool = False
    loop_stages: int | None = None
    warp_specialize: bool = False

    def __post_init__(self):
        if self.loop_stages is not None and not 1 <= self.loop_stages <= 6:
            from edgeattn.errors import ConfigError

            raise ConfigError(f"loop_stages: expected None or 1..6, found {self.loop_stages}")

    @property
    def name(self) -> str:
        parts = ["desc" if self.desc else "ptr"] + (["fold"] if self.fold_scale else [])
        parts += [f"ls{self.loop_stages}"] if self.loop_stages else []
        return "+".join(parts + (["ws"] if self.warp_specialize else []))


def _window_row(arch: int, head_dim: int, window_hint: int | None):
    """The PREFILL_WINDOW_TABLE row serving this window (0 / None: full), or None."""
    base = 90 if arch >= 90 and arch != 110 else (110 if arch == 110 else 87)
    d = 64 if head_dim <= 64 else 128
    w = int(window_hint or 0)
    for row in PREFILL_WINDOW_TABLE.get((base, d), []) if head_dim <= 128 else []:
        if row[0] == 0 or (0 < w <= row[0]):
            return row
    return None


def prefill_config_for_window(arch: int, head_dim: int, window_hint: int | None):
    """(tile, HopperVariant or None) for a window known on the host (0 / None / >= S: full), from
    PREFILL_WINDOW_TABLE; falls back to (prefill_tile(arch, head_dim), None)."""
    row = _window_row(arch, head_dim, window_hint)
    if row is None:
        return prefill_tile(arch, head_dim), None
    return tuple(row[1]), (HopperVariant(**row[2]) if row[2] is not None else None)


def prefill_tile_for_window(arch: int, head_dim: int, window_hint: int | None) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for a known window (PREFILL_WINDOW_TABLE, else prefill_tile)."""
    return prefill_config_for_window(arch, head_dim, window_hint)[0]


# ----------------------------------------------------------------------------------------------------
# Inner loop: online softmax over key blocks [start, stop) for one tile of queries.
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _allowed(pos, offs_n, window, sinks, S_k, CAUSAL: tl.constexpr):
    """[BLOCK_M, BLOCK_N] bool: key j attended by query position p (padding aside)."""
    j = offs_n[None, :]
    p = pos[:, None]
    in_window = (p - j) < window
    if CAUSAL:
        ok = j <= p
    else:
        in_window = in_window & ((j - p) < window)
        ok = j >= 0
    return ok & (j < S_k) & (in_window | (j < sinks))


@triton.jit
def _attend_blocks(acc, l_i, m_i, q, K, V, Mask, k_base, v_base, mask_base, stride_kn, stride_vn,
                   pos, offs_d, start, stop, window, sinks, S_k, qk_scale,
                   MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr,
                   BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr = False):
    # q: [BLOCK_M, D]; pos: [BLOCK_M] absolute query positions; acc: [BLOCK_M, D] fp32
    # USE_TMA: K, V are tensor descriptors over this head's [S_k, D] (out-of-range rows read as zeros)
    for start_n in range(start, stop, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)  # absolute key positions
        if USE_TMA:
            k = K.load([start_n, 0])  # k: [BLOCK_N, D]
        elif MASKED:
            k = tl.load(K + k_base + offs_n[:, None] * stride_kn + offs_d[None, :],
                        mask=(offs_n < S_k)[:, None], other=0.0)
        else:
            k = tl.load(K + k_base + offs_n[:, None] * stride_kn + offs_d[None, :])
        qk = tl.dot(q, tl.trans(k))  # qk: [BLOCK_M, BLOCK_N] fp32, unscaled
        if MASKED:
            ok = _allowed(pos, offs_n, window, sinks, S_k, CAUSAL)
            if HAS_PAD:
                real = tl.load(Mask + mask_base + offs_n, mask=offs_n < S_k, other=0)
                ok = ok & (real != 0)[None, :]
            qk = tl.where(ok, qk, float("-inf"))
        elif HAS_PAD:
            real = tl.load(Mask + mask_base + offs_n)
            qk = tl.where((real != 0)[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # log2 domain
        p_ij = tl.math.exp2(qk * qk_scale - m_new[:, None])  # one FMA per score
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p_ij, 1)
        if USE_TMA:
            v = V.load([start_n, 0])  # v: [BLOCK_N, D]
        elif MASKED:
            v = tl.load(V + v_base + offs_n[:, None] * stride_vn + offs_d[None, :],
                        mask=(offs_n < S_k)[:, None], other=0.0)
        else:
            v = tl.load(V + v_base + offs_n[:, None] * stride_vn + offs_d[None, :])
        acc = acc * alpha[:, None]
        acc = tl.dot(p_ij.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attend_one_loop(acc, l_i, m_i, q, K, V, Mask, k_base, v_base, mask_base, stride_kn, stride_vn,
                     pos, offs_d, n_sink, start_n, n_total, full_lo, full_hi, window, sinks, S_k, qk_scale,
                     CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                     USE_TMA: tl.constexpr):
    # One software-pipelined loop over block t: sink blocks first, then the window's blocks; only edge
    # blocks (outside [full_lo, full_hi)) pay for the mask. q: [BLOCK_M, D]; acc: [BLOCK_M, D] fp32
    for t in range(0, n_total):
        start = tl.where(t < n_sink, t * BLOCK_N, start_n + (t - n_sink) * BLOCK_N)
        offs_n = start + tl.arange(0, BLOCK_N)  # absolute key positions
        if USE_TMA:
            k = K.load([start, 0])  # k: [BLOCK_N, D]
        else:
            k = tl.load(K + k_base + offs_n[:, None] * stride_kn + offs_d[None, :],
                        mask=(offs_n < S_k)[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k))  # qk: [BLOCK_M, BLOCK_N] fp32, unscaled
        if HAS_PAD:
            real = tl.load(Mask + mask_base + offs_n, mask=offs_n < S_k, other=0)
            ok = _allowed(pos, offs_n, window, sinks, S_k, CAUSAL) & (real != 0)[None, :]
            qk = tl.where(ok, qk, float("-inf"))
        else:
            if (start < full_lo) | (start >= full_hi):
                qk = tl.where(_allowed(pos, offs_n, window, sinks, S_k, CAUSAL), qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # log2 domain
        p_ij = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p_ij, 1)
        if USE_TMA:
            v = V.load([start, 0])  # v: [BLOCK_N, D]
        else:
            v = tl.load(V + v_base + offs_n[:, None] * stride_vn + offs_d[None, :],
                        mask=(offs_n < S_k)[:, None], other=0.0)
        acc = acc * alpha[:, None]
        acc = tl.dot(p_ij.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _effective_window(Window, S_k):
    """The window tensor's value; 0, negative or >= S_k mean full attention (returned as S_k)."""
    w = tl.load(Window).to(tl.int32)
    return tl.where((w <= 0) | (w >= S_k), S_k, w)


# ----------------------------------------------------------------------------------------------------
# Prefill / encoder kernel. Argument order: inputs, scalars, output (TensorRT AOT plugin convention).
# ----------------------------------------------------------------------------------------------------
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
    # q, out: [B, H, S_q, D]; k, v: [B, H_kv, S_k, D]; window: [] int; mask: [B, S_k]
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)  # longest (causal) tiles first: shorter tail
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    hk = (h // GROUP).to(tl.int64)
    window = _effective_window(Window, S_k)
    qk_scale = sm_scale * 1.4426950408889634  # 1/ln 2: exp2 instead of exp

    first = pid_m * BLOCK_M
    rows = first + tl.arange(0, BLOCK_M)  # query row index
    offs_d = tl.arange(0, HEAD_DIM)
    q_off = S_k - S_q  # queries are the last S_q positions
    pos = rows + q_off
    p_min = first + q_off
    p_max = tl.minimum(first + BLOCK_M - 1, S_q - 1) + q_off

    q_ptrs = Q + b * stride_qb + h.to(tl.int64) * stride_qh + rows[:, None] * stride_qm + offs_d[None, :]
    q = tl.load(q_ptrs, mask=(rows < S_q)[:, None], other=0.0)  # q: [BLOCK_M, D]
    k_base = b * stride_kb + hk * stride_kh
    v_base = b * stride_vb + hk * stride_vh
    mask_base = b * stride_mb
    Kt, Vt = K, V
    if USE_TMA:  # Hopper bulk copies; bounds are this head's rows, so the tail block reads zeros
        Kt = tl.make_tensor_descriptor(K + k_base, shape=[S_k, HEAD_DIM], strides=[stride_kn, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
        Vt = tl.make_tensor_descriptor(V + v_base, shape=[S_k, HEAD_DIM], strides=[stride_vn, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])

    # Key range this tile can attend: [lo, end) plus the sinks below it.
    lo = tl.maximum(p_min - window + 1, 0)
    if CAUSAL:
        end = tl.minimum(p_max + 1, S_k)
        full_hi = ((p_min + 1) // BLOCK_N) * BLOCK_N  # blocks wholly at or below the diagonal
    else:
        end = tl.minimum(p_max + window, S_k)
        full_hi = (tl.minimum(p_min + window, S_k) // BLOCK_N) * BLOCK_N
    start_n = (lo // BLOCK_N) * BLOCK_N
    end_blk = tl.cdiv(end, BLOCK_N) * BLOCK_N
    # Blocks in [full_lo, full_hi) are inside every row's window: no mask needed.
    full_lo = tl.cdiv(tl.maximum(p_max - window + 1, 0), BLOCK_N) * BLOCK_N
    full_lo = tl.minimum(tl.maximum(full_lo, start_n), end_blk)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), end_blk)
    sink_stop = tl.minimum(sinks, start_n)

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + NEG_BIG
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if ONE_LOOP:
        n_sink = tl.cdiv(sink_stop, BLOCK_N)
        n_total = n_sink + (end_blk - start_n) // BLOCK_N
        acc, l_i, m_i = _attend_one_loop(acc, l_i, m_i, q, Kt, Vt, Mask, k_base, v_base, mask_base, stride_kn,
                                         stride_vn, pos, offs_d, n_sink, start_n, n_total, full_lo, full_hi,
                                         window, sinks, S_k, qk_scale, CAUSAL, HAS_PAD, BLOCK_N, USE_TMA)
    else:
        # 1) sinks left of the window, 2) window's left edge, 3) the band, 4) diagonal / right edge.
        acc, l_i, m_i = _attend_blocks(acc, l_i, m_i, q, Kt, Vt, Mask, k_base, v_base, mask_base, stride_kn,
                                       stride_vn, pos, offs_d, 0, sink_stop, window, sinks, S_k, qk_scale,
                                       True, CAUSAL, HAS_PAD, BLOCK_N, USE_TMA)
        acc, l_i, m_i = _attend_blocks(acc, l_i, m_i, q, Kt, Vt, Mask, k_base, v_base, mask_base, stride_kn,
                                       stride_vn, pos, offs_d, start_n, full_lo, window, sinks, S_k, qk_scale,
                                       True, CAUSAL, HAS_PAD, BLOCK_N, USE_TMA)
        acc, l_i, m_i = _attend_blocks(acc, l_i, m_i, q, Kt, Vt, Mask, k_base, v_base, mask_base, stride_kn,
                                       stride_vn, pos, offs_d, full_lo, full_hi, window, sinks, S_k, qk_scale,
                                       False, CAUSAL, HAS_PAD, BLOCK_N, USE_TMA)
        acc, l_i, m_i = _attend_blocks(acc, l_i, m_i, q, Kt, Vt, Mask, k_base, v_base, mask_base, stride_kn,
                                       stride_vn, pos, offs_d, full_hi, end_blk, window, sinks, S_k, qk_scale,
                                       True, CAUSAL, HAS_PAD, BLOCK_N, USE_TMA)

    l_safe = tl.where(l_i > 0, l_i, 1.0)  # rows with no attended key -> zeros
    out = acc / l_safe[:, None]
    o_ptrs = Out + b * stride_ob + h.to(tl.int64) * stride_oh + rows[:, None] * stride_om + offs_d[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=(rows < S_q)[:, None])


# ----------------------------------------------------------------------------------------------------
# Hopper (sm_90) prefill variant, JIT only (opt-in: windowed_prefill(hopper=HopperVariant(...)); the AOT
# builds keep _windowed_fwd_kernel). Differences from the kernel above:
# - DESC: Q, K, V arrive as host-built 4-D tensor descriptors over [B, H(kv), S, D] with block
#   [1, 1, BLOCK, D]: TMA bulk copies, rows past this head's S read as zeros, no scratch allocator.
# - two loops: an unmasked band (blocks inside every row's window: no mask, no bounds checks, plain or
#   TMA loads, `tl.range(num_stages=LOOP_STAGES)`, optionally warp-specialized), then one masked loop
#   over the edge blocks (window start, diagonal / right edge / sequence end) and the sinks.
# - FOLD_SCALE: q is multiplied by scale / ln 2 once (in fp32, rounded back to q's dtype) so a score
#   needs only a subtraction before exp2 (costs one extra rounding of q).
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _hopper_load(T, base, bh0, bh1, start, offs_n, offs_d, stride_n, S_k,
                 BOUNDS: tl.constexpr, DESC: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """One [BLOCK_N, D] tile of K or V (or Q) starting at row `start` of head (bh0, bh1)."""
    if DESC:
        t = T.load([bh0, bh1, start, 0]).reshape(BLOCK_N, HEAD_DIM)
    elif BOUNDS:
        t = tl.load(T + base + offs_n[:, None] * stride_n + offs_d[None, :], mask=(offs_n < S_k)[:, None], other=0.0)
    else:
        t = tl.load(T + base + offs_n[:, None] * stride_n + offs_d[None, :])
    return t


@triton.jit
def _hopper_step(acc, l_i, m_i, q, k, v, pos, offs_n, Mask, mask_base, window, sinks, S_k, qk_scale,
                 MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, FOLD_SCALE: tl.constexpr):
    # q: [BLOCK_M, D]; k, v: [BLOCK_N, D]; acc: [BLOCK_M, D] fp32; scores in the log2 domain
    qk = tl.dot(q, tl.trans(k))  # qk: [BLOCK_M, BLOCK_N] fp32
    if MASKED:
        ok = _allowed(pos, offs_n, window, sinks, S_k, CAUSAL)
        if HAS_PAD:
            real = tl.load(Mask + mask_base + offs_n, mask=offs_n < S_k, other=0)
            ok = ok & (real != 0)[None, :]
        qk = tl.where(ok, qk, float("-inf"))
    elif HAS_PAD:
        real = tl.load(Mask + mask_base + offs_n)
        qk = tl.where((real != 0)[None, :], qk, float("-inf"))
    if FOLD_SCALE:
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p_ij = tl.math.exp2(qk - m_new[:, None])
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p_ij = tl.math.exp2(qk * qk_scale - m_new[:, None])  # one FMA per score
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p_ij, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p_ij.to(v.dtype), v, acc)
    return acc, l_i, m_new


@triton.jit
def _hopper_edges(acc, l_i, m_i, q, K, V, Mask, k_base, v_base, mask_base, b, hk, stride_kn, stride_vn,
                  pos, offs_d, start_n, full_lo, full_hi, end_blk, sink_stop, window, sinks, S_k, qk_scale,
                  CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, FOLD_SCALE: tl.constexpr, DESC: tl.constexpr,
                  BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    # One masked loop over the few edge blocks: window start [start_n, full_lo), diagonal / right edge /
    # sequence end [full_hi, end_blk), then the sinks left of the window [0, sink_stop).
    n_left = (full_lo - start_n) // BLOCK_N
    n_right = (end_blk - full_hi) // BLOCK_N
    n_edge = n_left + n_right
    for t in range(0, n_edge + tl.cdiv(sink_stop, BLOCK_N)):
        start = tl.where(t < n_left, start_n + t * BLOCK_N,
                         tl.where(t < n_edge, full_hi + (t - n_left) * BLOCK_N, (t - n_edge) * BLOCK_N))
        offs_n = start + tl.arange(0, BLOCK_N)
        k = _hopper_load(K, k_base, b, hk, start, offs_n, offs_d, stride_kn, S_k, True, DESC, BLOCK_N, HEAD_DIM)
        v = _hopper_load(V, v_base, b, hk, start, offs_n, offs_d, stride_vn, S_k, True, DESC, BLOCK_N, HEAD_DIM)
        acc, l_i, m_i = _hopper_step(acc, l_i, m_i, q, k, v, pos, offs_n, Mask, mask_base, window, sinks, S_k,
                                     qk_scale, True, CAUSAL, HAS_PAD, FOLD_SCALE)
    return acc, l_i, m_i


@triton.jit
def _hopper_band(acc, l_i, m_i, q, K, V, Mask, k_base, v_base, mask_base, b, hk, stride_kn, stride_vn,
                 pos, offs_d, lo, hi, window, sinks, S_k, qk_scale,
                 CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, FOLD_SCALE: tl.constexpr, DESC: tl.constexpr,
                 BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, LOOP_STAGES: tl.constexpr,
                 WARP_SPEC: tl.constexpr):
    # blocks [lo, hi) lie inside every row's window and below S_k: no mask, no bounds checks
    if WARP_SPEC:
        for start_n in tl.range(lo, hi, BLOCK_N, num_stages=LOOP_STAGES, warp_specialize=True):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            k = _hopper_load(K, k_base, b, hk, start_n, offs_n, offs_d, stride_kn, S_k, False, DESC, BLOCK_N, HEAD_DIM)
            v = _hopper_load(V, v_base, b, hk, start_n, offs_n, offs_d, stride_vn, S_k, False, DESC, BLOCK_N, HEAD_DIM)
            acc, l_i, m_i = _hopper_step(acc, l_i, m_i, q, k, v, pos, offs_n, Mask, mask_base, window, sinks, S_k,
                                         qk_scale, False, CAUSAL, HAS_PAD, FOLD_SCALE)
    else:
        for start_n in tl.range(lo, hi, BLOCK_N, num_stages=LOOP_STAGES):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            k = _hopper_load(K, k_base, b, hk, start_n, offs_n, offs_d, stride_kn, S_k, False, DESC, BLOCK_N, HEAD_DIM)
            v = _hopper_load(V, v_base, b, hk, start_n, offs_n, offs_d, stride_vn, S_k, False, DESC, BLOCK_N, HEAD_DIM)
            acc, l_i, m_i = _hopper_step(acc, l_i, m_i, q, k, v, pos, offs_n, Mask, mask_base, window, sinks, S_k,
                                         qk_scale, False, CAUSAL, HAS_PAD, FOLD_SCALE)
    return acc, l_i, m_i


@triton.jit
def _windowed_fwd_hopper_kernel(
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
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DESC: tl.constexpr, FOLD_SCALE: tl.constexpr,
    LOOP_STAGES: tl.constexpr, WARP_SPEC: tl.constexpr,
):
    # q, out: [B, H, S_q, D]; k, v: [B, H_kv, S_k, D] (DESC: 4-D descriptors over the same); window: []
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)  # longest (causal) tiles first
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP
    window = _effective_window(Window, S_k)
    qk_scale = sm_scale * 1.4426950408889634  # 1/ln 2: exp2 instead of exp

    first = pid_m * BLOCK_M
    rows = first + tl.arange(0, BLOCK_M)  # query row index
    offs_d = tl.arange(0, HEAD_DIM)
    q_off = S_k - S_q  # queries are the last S_q positions
    pos = rows + q_off
    p_min = first + q_off
    p_max = tl.minimum(first + BLOCK_M - 1, S_q - 1) + q_off

    q_base = b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    k_base = b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
    v_base = b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
    mask_base = b.to(tl.int64) * stride_mb
    q = _hopper_load(Q, q_base, b, h, first, rows, offs_d, stride_qm, S_q, True, DESC, BLOCK_M, HEAD_DIM)
    if FOLD_SCALE:
        q = (q.to(tl.float32) * qk_scale).to(q.dtype)  # q: [BLOCK_M, D], scores come out in log2 units

    # Key range: [start_n, end_blk) in blocks, plus the sinks below start_n.
    lo = tl.maximum(p_min - window + 1, 0)
    if CAUSAL:
        end = tl.minimum(p_max + 1, S_k)
        band_hi = p_min + 1  # keys <= every row's position
    else:
        end = tl.minimum(p_max + window, S_k)
        band_hi = tl.minimum(p_min + window, S_k)  # keys inside every row's right edge
    band_hi = tl.minimum(band_hi, S_k)
    start_n = (lo // BLOCK_N) * BLOCK_N
    end_blk = tl.cdiv(end, BLOCK_N) * BLOCK_N
    # [full_lo, full_hi): blocks inside every row's window and below S_k: the unmasked band
    full_lo = tl.cdiv(tl.maximum(p_max - window + 1, 0), BLOCK_N) * BLOCK_N
    full_lo = tl.minimum(tl.maximum(full_lo, start_n), end_blk)
    full_hi = (band_hi // BLOCK_N) * BLOCK_N
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), end_blk)
    sink_stop = tl.minimum(sinks, start_n)

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + NEG_BIG
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # 1) the band (most of the work, no mask), 2) one masked loop over the edge blocks and the sinks
    acc, l_i, m_i = _hopper_band(acc, l_i, m_i, q, K, V, Mask, k_base, v_base, mask_base, b, hk, stride_kn,
                                 stride_vn, pos, offs_d, full_lo, full_hi, window, sinks, S_k, qk_scale,
                                 CAUSAL, HAS_PAD, FOLD_SCALE, DESC, BLOCK_N, HEAD_DIM, LOOP_STAGES, WARP_SPEC)
    acc, l_i, m_i = _hopper_edges(acc, l_i, m_i, q, K, V, Mask, k_base, v_base, mask_base, b, hk, stride_kn,
                                  stride_vn, pos, offs_d, start_n, full_lo, full_hi, end_blk, sink_stop, window,
                                  sinks, S_k, qk_scale, CAUSAL, HAS_PAD, FOLD_SCALE, DESC, BLOCK_N, HEAD_DIM)

    l_safe = tl.where(l_i > 0, l_i, 1.0)  # rows with no attended key -> zeros
    out = acc / l_safe[:, None]
    o_base = b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    o_ptrs = Out + o_base + rows[:, None] * stride_om + offs_d[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=(rows < S_q)[:, None])

# ----------------------------------------------------------------------------------------------------
# Decode (flash-decoding): split the attended key blocks (sinks + window) across programs, then reduce.
# One program serves all GROUP query heads of a kv head, so each K/V byte is read once.
# ----------------------------------------------------------------------------------------------------
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
    # q: [B, H, S_q, D]; k, v: [B, H_kv, S_k, D]
    # part_o: [B*H_kv, SPLITS, BLOCK_M, D] fp32; part_m, part_l: [B*H_kv, SPLITS, BLOCK_M] fp32
    split = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H_kv).to(tl.int64)
    hk = (pid_bh % H_kv).to(tl.int64)
    window = _effective_window(Window, S_k)
    qk_scale = sm_scale * 1.4426950408889634  # 1/ln 2

    r = tl.arange(0, BLOCK_M)  # row = (head in group) * S_q + query
    valid = r < GROUP * S_q
    head = hk * GROUP + (r // S_q)
    qi = r % S_q
    pos = qi + (S_k - S_q)
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptrs = Q + b * stride_qb + head[:, None] * stride_qh + qi[:, None] * stride_qm + offs_d[None, :]
    q = tl.load(q_ptrs, mask=valid[:, None], other=0.0)  # q: [BLOCK_M, D]

    # Attended key blocks: sinks below the window, then the window up to S_k.
    lo = tl.maximum(S_k - S_q - window + 1, 0)
    start_n = (lo // BLOCK_N) * BLOCK_N
    n_sink = tl.cdiv(tl.minimum(sinks, start_n), BLOCK_N)
    n_total = n_sink + tl.cdiv(S_k - start_n, BLOCK_N)
    per = tl.cdiv(n_total, SPLITS)
    t0 = tl.minimum(split * per, n_total)
    t1 = tl.minimum(t0 + per, n_total)

    k_base = b * stride_kb + hk * stride_kh
    v_base = b * stride_vb + hk * stride_vh
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + NEG_BIG
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    s0 = tl.minimum(t0, n_sink) * BLOCK_N
    s1 = tl.minimum(t1, n_sink) * BLOCK_N
    acc, l_i, m_i = _attend_blocks(acc, l_i, m_i, q, K, V, Mask, k_base, v_base, b * stride_mb, stride_kn,
                                   stride_vn, pos, offs_d, s0, s1, window, sinks, S_k, qk_scale,
                                   True, CAUSAL, HAS_PAD, BLOCK_N)
    w0 = start_n + (tl.maximum(t0, n_sink) - n_sink) * BLOCK_N
    w1 = start_n + (tl.maximum(t1, n_sink) - n_sink) * BLOCK_N
    acc, l_i, m_i = _attend_blocks(acc, l_i, m_i, q, K, V, Mask, k_base, v_base, b * stride_mb, stride_kn,
                                   stride_vn, pos, offs_d, w0, w1, window, sinks, S_k, qk_scale,
                                   True, CAUSAL, HAS_PAD, BLOCK_N)

    part = (pid_bh.to(tl.int64) * SPLITS + split) * BLOCK_M
    tl.store(PartO + (part + r[:, None]) * HEAD_DIM + offs_d[None, :], acc)
    tl.store(PartM + part + r, m_i)
    tl.store(PartL + part + r, l_i)


@triton.jit
def _windowed_decode_reduce_kernel(
    PartO, PartM, PartL,
    stride_ob, stride_oh, stride_om,
    H_kv, GROUP, S_q,
    Out,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, SPLITS: tl.constexpr,
):
    # one program per (b, kv head, row); combines the SPLITS partial softmaxes of that row
    pid_bh = tl.program_id(0)
    r = tl.program_id(1)
    b = (pid_bh // H_kv).to(tl.int64)
    hk = (pid_bh % H_kv).to(tl.int64)
    s = tl.arange(0, SPLITS)
    offs_d = tl.arange(0, HEAD_DIM)
    part = (pid_bh.to(tl.int64) * SPLITS + s) * BLOCK_M + r  # [SPLITS]
    m = tl.load(PartM + part)
    l = tl.load(PartL + part)
    o = tl.load(PartO + part[:, None] * HEAD_DIM + offs_d[None, :])  # o: [SPLITS, D]
    m_all = tl.max(m, 0)
    w = tl.math.exp2(m - m_all)
    l_all = tl.sum(l * w, 0)
    acc = tl.sum(o * w[:, None], 0)
    out = acc / tl.where(l_all > 0, l_all, 1.0)
    head = hk * GROUP + r // S_q
    qi = r % S_q
    tl.store(Out + b * stride_ob + head * stride_oh + qi * stride_om + offs_d, out.to(Out.dtype.element_ty))


# ----------------------------------------------------------------------------------------------------
# Launch wrappers
# ----------------------------------------------------------------------------------------------------
def _check(q, k, v, window, key_padding_mask):
    from edgeattn.errors import InputError

    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise InputError(f"q, k, v: expected 4-D [B, H, S, D], found {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    b, h, s_q, d = q.shape
    _, h_kv, s_k, _ = k.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise InputError(f"k, v: expected [B={b}, H_kv, S_k, D={d}] alike, found {tuple(k.shape)}, {tuple(v.shape)}")
    if h % h_kv:
        raise InputError(f"heads: expected H % H_kv == 0, found H={h}, H_kv={h_kv}")
    if s_q > s_k:
        raise InputError(f"S_q: expected <= S_k={s_k} (queries are the last S_q positions), found {s_q}")
    if d not in (16, 32, 64, 128, 256):
        raise InputError(f"head dim: expected one of 16, 32, 64, 128, 256, found {d}")
    import torch

    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise InputError(f"dtype: expected q, k, v all fp16 or bf16, found {q.dtype}, {k.dtype}, {v.dtype}")
    if window.numel() != 1 or window.dtype.is_floating_point:
        raise InputError(f"window: expected an integer scalar tensor, found {window.dtype} {tuple(window.shape)}")
    if window.device != q.device:
        raise InputError(f"window: expected on {q.device} (read inside the kernel), found {window.device}")
    if key_padding_mask is not None and tuple(key_padding_mask.shape) != (b, s_k):
        raise InputError(f"key_padding_mask: expected [B={b}, S_k={s_k}], found {tuple(key_padding_mask.shape)}")


def _arch(device) -> int:
    import torch

    if device.type != "cuda":
        return 90  # TRITON_INTERPRET=1 on CPU tensors: any tile that fits
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


def _last_dim_contiguous(t):
    return t if t.stride(-1) == 1 else t.contiguous()


def _set_tma_allocator(device) -> None:
    """In-kernel tensor descriptors need a small global scratch buffer from Triton's allocator."""
    import torch

    def alloc(size: int, alignment: int, stream):
        return torch.empty(size, dtype=torch.int8, device=device)

    triton.set_allocator(alloc)


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


def _launch_hopper(q, k, v, window, mask, out, *, sinks, causal, scale, has_pad, tile, variant, arch):
    b, h, s_q, d = q.shape
    h_kv, s_k = k.shape[1], k.shape[2]
    bm, bn, warps, stages = tile
    use_desc = variant.desc
    if use_desc:
        reason = descriptor_problem(arch, q, k, v)
        if reason is not None:
            import warnings

            warnings.warn(f"windowed_prefill: tensor descriptors off, plain loads instead: {reason}", stacklevel=3)
            use_desc = False
    qa, ka, va = q, k, v
    if use_desc:
        from triton.tools.tensor_descriptor import TensorDescriptor

        # 4-D over [B, H(kv), S, D], one head's rows per block: rows past S read as zeros
        qa = TensorDescriptor(q, list(q.shape), list(q.stride()), [1, 1, bm, d])
        ka = TensorDescriptor(k, list(k.shape), list(k.stride()), [1, 1, bn, d])
        va = TensorDescriptor(v, list(v.shape), list(v.stride()), [1, 1, bn, d])
    grid = (triton.cdiv(s_q, bm), b * h)
    _windowed_fwd_hopper_kernel[grid](
        qa, ka, va, window, mask,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        mask.stride(0) if has_pad else 0,
        h, h // h_kv, s_q, s_k, int(sinks), float(scale or d ** -0.5),
        out,
        CAUSAL=bool(causal), HAS_PAD=has_pad, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, DESC=use_desc,
        FOLD_SCALE=bool(variant.fold_scale), LOOP_STAGES=int(variant.loop_stages or stages),
        WARP_SPEC=bool(variant.warp_specialize), num_warps=warps, num_stages=stages,
    )
    return out


def windowed_prefill(q, k, v, window, *, sinks=0, causal=True, scale=0.0, key_padding_mask=None,
                     tile: tuple[int, int, int, int] | None = None, use_tma: bool | None = None,
                     one_loop: bool = True, hopper: HopperVariant | dict | str | None = "auto",
                     window_hint: int | None = None):
    """Prefill / encoder path. q: [B, H, S_q, D]; k, v: [B, H_kv, S_k, D]; window: int tensor [].

    use_tma: load K/V with in-kernel Hopper tensor descriptors (sm_90+; default per PREFILL_TMA).
    one_loop: one pipelined loop over all key blocks (default) rather than one loop per region.
    hopper: run the opt-in sm_90 kernel (_windowed_fwd_hopper_kernel) with these options (a
    HopperVariant or its fields as a dict); use_tma / one_loop do not apply to it. None: the default
    kernel. "auto": PREFILL_HOPPER[arch] on CUDA when use_tma is not given, else the default kernel.
    window_hint: the window's value when the host knows it: picks tile (and kernel, unless `hopper` is
    given) from PREFILL_WINDOW_TABLE when `tile` is None. The kernel still reads `window`.
    """
    import torch

    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    b, h, s_q, d = q.shape
    h_kv, s_k = k.shape[1], k.shape[2]
    out = torch.empty_like(q)  # out: [B, H, S_q, D]
    arch = _arch(q.device)
    if tile is None and window_hint is not None and _window_row(arch, d, window_hint if window_hint < s_k else 0):
        tile, hinted = prefill_config_for_window(arch, d, window_hint if window_hint < s_k else 0)
        hopper = hinted if isinstance(hopper, str) else hopper
    if isinstance(hopper, str):
        if hopper != "auto":
            from edgeattn.errors import InputError

            raise InputError(f"hopper: expected a HopperVariant, a dict, None or 'auto', found {hopper!r}")
        hopper = PREFILL_HOPPER.get(arch) if q.is_cuda and use_tma is None else None
    bm, bn, warps, stages = tile or prefill_tile(arch, d)
    if hopper is not None:
        variant = hopper if isinstance(hopper, HopperVariant) else HopperVariant(**hopper)
        mask = key_padding_mask.to(torch.int8).contiguous() if key_padding_mask is not None else window
        return _launch_hopper(q, k, v, window, mask, out, sinks=sinks, causal=causal, scale=scale,
                              has_pad=key_padding_mask is not None, tile=(bm, bn, warps, stages),
                              variant=variant, arch=arch)
    if use_tma is None:
        use_tma = PREFILL_TMA.get(arch, False) and q.is_cuda
    if use_tma:
        _set_tma_allocator(q.device)
    mask = key_padding_mask.to(torch.int8).contiguous() if key_padding_mask is not None else window
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


def decode_splits(batch_kv_heads: int, s_k: int, sms: int = 132) -> int:
    """Splits per kv head so that the grid fills one wave of programs, capped by the key blocks."""
    want = max(1, -(-sms // batch_kv_heads))
    blocks = max(1, -(-s_k // DECODE_BLOCK_N))
    return min(1 << (want - 1).bit_length(), 1 << (blocks - 1).bit_length(), 128)


def windowed_decode(q, k, v, window, *, sinks=0, causal=True, scale=0.0, key_padding_mask=None,
                    splits: int | None = None):
    """Decode path (S_q small): split-K over the sinks + window blocks, then a reduction."""
    import torch

    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    b, h, s_q, d = q.shape
    h_kv, s_k = k.shape[1], k.shape[2]
    group = h // h_kv
    block_m = max(16, triton.next_power_of_2(group * s_q))
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 4
    n_split = splits or decode_splits(b * h_kv, s_k, sms)
    part_o = torch.empty((b * h_kv, n_split, block_m, d), device=q.device, dtype=torch.float32)
    part_m = torch.empty((b * h_kv, n_split, block_m), device=q.device, dtype=torch.float32)
    part_l = torch.empty_like(part_m)
    out = torch.empty_like(q)  # out: [B, H, S_q, D]
    mask = key_padding_mask.to(torch.int8).contiguous() if key_padding_mask is not None else window
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


def windowed_attention(q, k, v, window, *, sinks: int = 0, causal: bool = True, scale: float = 0.0,
                       key_padding_mask=None):
    """edgeattn::WindowedAttention on CUDA (or CPU under TRITON_INTERPRET=1).

    q: [B, H, S_q, D]; k, v: [B, H_kv, S_k, D] (fp16/bf16); window: integer scalar tensor on q's device
    (0, negative or >= S_k: full). Returns [B, H, S_q, D]. S_q <= 16 takes the split-K decode kernel.
    """
    _check(q, k, v, window, key_padding_mask)
    if sinks < 0:
        from edgeattn.errors import InputError

        raise InputError(f"sinks: expected >= 0, found {sinks}")
    group_rows = (q.shape[1] // k.shape[1]) * q.shape[2]
    path = windowed_decode if q.shape[2] <= DECODE_MAX_QUERIES and group_rows <= 64 else windowed_prefill
    return path(q, k, v, window, sinks=sinks, causal=causal, scale=scale, key_padding_mask=key_padding_mask)


def attended_pairs(s_q: int, s_k: int, window: int, sinks: int, causal: bool) -> int:
    """Number of (query, key) pairs attended (no padding): the useful work, for FLOP counts."""
    import numpy as np

    if s_q * s_k <= 1 << 24:
        from edgeattn.attention.reference import allowed_mask_np

        return int(allowed_mask_np(s_q, s_k, window, sinks, causal).sum())
    p = np.arange(s_q, dtype=np.int64) + (s_k - s_q)
    w = s_k if window <= 0 or window >= s_k else window
    lo = np.maximum(p - w + 1, 0)
    hi = p + 1 if causal else np.minimum(p + w, s_k)
    n = hi - lo + np.minimum(sinks, lo)  # window band + sinks left of it
    if not causal:
        n += np.maximum(np.minimum(sinks, s_k) - hi, 0)  # sinks right of a bidirectional band
    return int(n.sum())


__all__ = ["windowed_attention", "windowed_prefill", "windowed_decode", "attended_pairs", "prefill_tile",
           "decode_splits", "PREFILL_TMA", "PREFILL_TILES", "HopperVariant", "PREFILL_WINDOW_TABLE", "PREFILL_HOPPER",
           "prefill_tile_for_window", "prefill_config_for_window", "descriptor_problem"]
