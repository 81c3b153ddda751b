"""Triton device functions shared by the kernel families (prefill.py, prefill_hopper.py, decode.py).

The window read from its device tensor, the key mask, the prefill prologue (which query tile a program
owns and which key blocks it visits; one definition for both prefill kernels), and the per-region
online-softmax loop that the prefill kernel (one_loop=False) and the split-K decode kernel run.

Scores live in the log2 domain (`qk * scale / ln 2`) so that softmax uses exp2. Masked scores are -inf
(weight exactly 0). Triton inlines these functions into each kernel.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # 1/ln 2: exp(x) = exp2(x * LOG2E)
# A finite "minus infinity" for the running max: a row that has seen only masked keys keeps it, and
# exp2(NEG_BIG - NEG_BIG) = 1 rather than NaN.
NEG_BIG = tl.constexpr(-1.0e30)


@triton.jit
def mma(a, b, acc):
    """acc + a @ b. fp32 operands multiply in fp32 (input_precision "ieee"), as PyTorch's matmuls do by default;
    tensor cores would round them to tf32 (~1e-3), enough to flip a greedy choice between a batched decode step and
    the same stream's step alone. bf16, fp16 and fp8 operands take the tensor cores as before."""
    if a.dtype == tl.float32:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def dot(a, b):
    """a @ b in fp32, with mma's rule for fp32 operands."""
    if a.dtype == tl.float32:
        r = tl.dot(a, b, input_precision="ieee")
    else:
        r = tl.dot(a, b)
    return r


@triton.jit
def effective_window(Window, S_k):
    """The window tensor's value; 0, negative or >= S_k mean full attention (returned as S_k)."""
    w = tl.load(Window).to(tl.int32)
    return tl.where((w <= 0) | (w >= S_k), S_k, w)


@triton.jit
def key_allowed(pos, offs_n, window, sinks, S_k, CAUSAL: tl.constexpr):
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
def mask_scores(qk, pos, offs_n, Mask, mask_base, window, sinks, S_k,
                MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr):
    """qk [BLOCK_M, BLOCK_N] with -inf at the keys a row does not attend. MASKED: window, sinks, causal
    side and S_k bounds (keys past S_k read no padding byte); HAS_PAD: the [B, S_k] padding mask too."""
    if MASKED:
        ok = key_allowed(pos, offs_n, window, sinks, S_k, CAUSAL)
        if HAS_PAD:
            real = tl.load(Mask + mask_base + offs_n, mask=offs_n < S_k, other=0)
            ok = ok & (real != 0)[None, :]
        qk = tl.where(ok, qk, float("-inf"))
    elif HAS_PAD:
        real = tl.load(Mask + mask_base + offs_n)
        qk = tl.where((real != 0)[None, :], qk, float("-inf"))
    return qk


@triton.jit
def query_tile(Window, H, GROUP, S_q, S_k, sm_scale, BLOCK_M: tl.constexpr):
    """The prefill prologue: this program's batch, head, kv head and query rows.

    Grid (cdiv(S_q, BLOCK_M), B * H); tiles run last first (causal: the longest tiles first, so a shorter
    tail). Queries are the last S_q of the S_k positions. Returns b, h, hk (b and hk int64, h int32), the
    effective window, qk_scale (sm_scale / ln 2), the tile's first row, rows [BLOCK_M], their positions
    pos [BLOCK_M], and the tile's smallest and largest position p_min, p_max (rows past S_q left out).
    """
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)  # int64: offsets like b * stride_qb may pass 2**31
    h = pid_bh % H
    hk = (h // GROUP).to(tl.int64)  # GQA: query head h reads kv head h // (H / H_kv)
    window = effective_window(Window, S_k)
    qk_scale = sm_scale * LOG2E  # exp2 instead of exp
    first = pid_m * BLOCK_M
    rows = first + tl.arange(0, BLOCK_M)  # query row index
    q_off = S_k - S_q
    pos = rows + q_off  # pos: [BLOCK_M] absolute query positions
    p_min = first + q_off
    p_max = tl.minimum(first + BLOCK_M - 1, S_q - 1) + q_off
    return b, h, hk, window, qk_scale, first, rows, pos, p_min, p_max


@triton.jit
def key_blocks(p_min, p_max, window, sinks, S_k, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """The key blocks a query tile with positions [p_min, p_max] visits, as block-aligned key offsets.

    Returns start_n, end_blk, full_lo, full_hi, sink_stop. [start_n, end_blk): the window's blocks, up
    to the diagonal (causal) or the right edge; inside it, [full_lo, full_hi): blocks inside every row's
    window and below S_k (no mask needed); [0, sink_stop): the sinks left of the window. Work ~
    (p_max - p_min + W + sinks) keys per row, not S_k.
    """
    lo = tl.maximum(p_min - window + 1, 0)
    if CAUSAL:
        end = tl.minimum(p_max + 1, S_k)
        full_hi = ((p_min + 1) // BLOCK_N) * BLOCK_N  # keys <= every row's position (p_min < S_k)
    else:
        end = tl.minimum(p_max + window, S_k)
        full_hi = (tl.minimum(p_min + window, S_k) // BLOCK_N) * BLOCK_N  # inside every row's right edge
    start_n = (lo // BLOCK_N) * BLOCK_N
    end_blk = tl.cdiv(end, BLOCK_N) * BLOCK_N
    full_lo = tl.cdiv(tl.maximum(p_max - window + 1, 0), BLOCK_N) * BLOCK_N  # inside every row's left edge
    full_lo = tl.minimum(tl.maximum(full_lo, start_n), end_blk)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), end_blk)
    sink_stop = tl.minimum(sinks, start_n)
    return start_n, end_blk, full_lo, full_hi, sink_stop


@triton.jit
def load_block(T, base, start_n, offs_n, offs_d, stride_n, S_k, MASKED: tl.constexpr, USE_TMA: tl.constexpr):
    """The [BLOCK_N, D] block of K or V at key positions offs_n (= start_n + arange(BLOCK_N)). USE_TMA: T is a
    tensor descriptor over this head's [S_k, D]; MASKED: rows at or past S_k read as zeros; else a plain load."""
    if USE_TMA:
        t = T.load([start_n, 0])
    elif MASKED:
        t = tl.load(T + base + offs_n[:, None] * stride_n + offs_d[None, :], mask=(offs_n < S_k)[:, None], other=0.0)
    else:
        t = tl.load(T + base + offs_n[:, None] * stride_n + offs_d[None, :])
    return t


@triton.jit
def softmax_update(acc, l_i, m_i, qk, qk_scale, V, v_base, start_n, offs_n, offs_d, stride_vn, S_k,
                   MASKED: tl.constexpr, USE_TMA: tl.constexpr):
    """One online-softmax step over a block's masked, unscaled scores qk [BLOCK_M, BLOCK_N]: the running max
    and sum, then the block of V (load_block) into acc [BLOCK_M, D] fp32. Returns the updated acc, l_i, m_i."""
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # log2 domain
    p_ij = tl.math.exp2(qk * qk_scale - m_new[:, None])  # one FMA per score
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p_ij, 1)
    v = load_block(V, v_base, start_n, offs_n, offs_d, stride_vn, S_k, MASKED, USE_TMA)  # v: [BLOCK_N, D]
    acc = acc * alpha[:, None]
    acc = mma(p_ij.to(v.dtype), v, acc)
    return acc, l_i, m_new


@triton.jit
def load_rows(T, base, rows, live, offs_d, stride_n):
    """Cache rows `rows` [BLOCK_N] (int64) of one head as [BLOCK_N, D]; rows where `live` is False read as zeros."""
    return tl.load(T + base + rows[:, None] * stride_n + offs_d[None, :], mask=live[:, None], other=0.0)


@triton.jit
def decode_step(acc, l_i, m_i, q, k, v, live, qk_scale):
    """One online-softmax step of a decode tile: q [BLOCK_M, D] against a block's keys and values k, v
    [BLOCK_N, D] (keys where `live` is False count for nothing); qk_scale carries log2(e), so the scores are in
    the log2 domain. Returns the updated acc [BLOCK_M, D] fp32, l_i and m_i [BLOCK_M]."""
    qk = dot(q, tl.trans(k)) * qk_scale
    qk = tl.where(live[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(qk - m_new[:, None])
    return mma(p.to(v.dtype), v, acc * alpha[:, None]), l_i * alpha + tl.sum(p, 1), m_new


@triton.jit
def attend_blocks(acc, l_i, m_i, q, K, V, Mask, k_base, v_base, mask_base, stride_kn, stride_vn,
                  pos, offs_d, start, stop, window, sinks, S_k, qk_scale,
                  MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr,
                  BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr = False):
    """Online softmax over the key blocks [start, stop) for one tile of queries (one region: MASKED
    says whether its blocks need the window mask and S_k bounds). Returns the updated acc, l_i, m_i."""
    # q: [BLOCK_M, D]; pos: [BLOCK_M] absolute query positions; acc: [BLOCK_M, D] fp32; l_i, m_i: [BLOCK_M]
    # USE_TMA: K, V are tensor descriptors over this head's [S_k, D] (out-of-range rows read as zeros)
    for start_n in range(start, stop, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)  # absolute key positions
        k = load_block(K, k_base, start_n, offs_n, offs_d, stride_kn, S_k, MASKED, USE_TMA)  # k: [BLOCK_N, D]
        qk = dot(q, tl.trans(k))  # qk: [BLOCK_M, BLOCK_N] fp32, unscaled
        qk = mask_scores(qk, pos, offs_n, Mask, mask_base, window, sinks, S_k, MASKED, CAUSAL, HAS_PAD)
        acc, l_i, m_i = softmax_update(acc, l_i, m_i, qk, qk_scale, V, v_base, start_n, offs_n, offs_d, stride_vn,
                                       S_k, MASKED, USE_TMA)
    return acc, l_i, m_i


__all__ = ["LOG2E", "NEG_BIG", "attend_blocks", "effective_window", "key_allowed", "key_blocks", "load_block",
           "mask_scores", "query_tile", "softmax_update"]
