"""Fused decode-step kernels for a Llama-family decoder: a few launches a layer instead of ~10.

One new token per stream; the residual stream h [B, hidden] lives in the model's dtype. Per layer:

    _qkv_rope_kernel        RMSNorm (each program recomputes the norm of the small [B, hidden] input) + the
                            packed Q/K/V product + bias + Qwen3's per-head norms + the rotation at t (and q's
                            second rotation at min(t, sinks + W) for the sink rows) + the ring write of the new
                            key and value rows; layer 0 gathers h from the embedding table itself
    (attention)             cached_decode.py's split-K kernel over the rows just written (when split, the last split
                            program of each kv head merges the partials: no reduce kernel)
    _linear_residual_kernel the output projection, added to h in place
    _gate_up_kernel         RMSNorm + the packed gate/up product + SiLU(gate) * up
    _linear_residual_kernel the down projection, added to h in place

and once a step `_lm_head_kernel` (the final norm + the LM head, writing logits and a per-block argmax) and, for
greedy decoding, `_argmax_kernel` (the argmax of those block maxima): 5 launches a layer. The live window is
read from its device tensor by the kernels, so a CUDA graph of the step needs no new capture when it changes.
On Hopper and newer every kernel is a programmatic dependent of the one before (dependent_launch.py): it is
launched while that one finishes, asks for its own weight rows in L2, and only then waits for its inputs.

Per batch bucket (FUSED_TILES, measured on the H200 with benchmarks/cuda_step_h200.py):
- up to 4 streams: one stream a program (GEMV), elementwise products over a fully unrolled reduction (the sizes are
  compile-time constants), so every weight load of a program is in flight at once; a step this small waits on
  memory latency and launches, not arithmetic. SmolLM2-135M, context 8,192: 0.66-0.80 ms a token against 1.14-1.23
  for torch.compile + cuBLAS ("linked").
- above: tl.dot tiles of 32 streams, small programs (many of them). At batch 64 (attention in 2 splits) they are
  level with cuBLAS at W=1024 (1.64 ms), faster at W=256 (1.14 against 1.28) and slower with the whole ring of
  8,192 (5.33 against 4.66): the decode step's "auto" mode takes them up to 64 streams (runtime/cuda/decode_step.py's
  FUSED_MAX_BATCH).
Numerics: products accumulate in float32; each product's output is rounded to the model's dtype where the eager
step (runtime/cuda/decode_step.py) rounds it; bf16 steps still round differently in places (the rotation and the
norms run in float32 here), so greedy tokens agree with the eager step except at near-ties (61-64 of 64 steps on the
30-layer shape with random weights). Reads top to bottom: shared device functions, the kernels, the launches,
the ahead-of-time specs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import triton
import triton.language as tl

from edgeattn.plugins.kernels.dependent_launch import dependent_launch, dependent_start, lines_of, prefetch_l2

LOG2E_F = 1.4426950408889634  # 1/ln 2 (host side)


# --- device functions ---------------------------------------------------------------------------------------------
@triton.jit
def _rstd(X, x_rows, row_ok, K: tl.constexpr, eps, BLOCK_K: tl.constexpr):
    """1 / RMS of the rows at element offsets x_rows [BB] (int64) of X, over K features: [BB] float32. The loop is
    unrolled (K is a compile-time shape), so every load is in flight at once."""
    ss = tl.zeros([x_rows.shape[0], BLOCK_K], dtype=tl.float32)
    for k0 in tl.static_range(0, K, BLOCK_K):
        offs = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(X + x_rows[:, None] + offs[None, :], mask=row_ok[:, None] & (offs < K)[None, :], other=0.0)
        x = x.to(tl.float32)
        ss += x * x
    return 1.0 / tl.sqrt(tl.sum(ss, 1) / K + eps)


@triton.jit
def _x_block(X, x_rows, row_ok, offs, K: tl.constexpr, rstd, LnW, NORM: tl.constexpr):
    """The [BB, BK] block of the input at features offs, normed (RMSNorm, rounded as the eager step rounds) when
    NORM."""
    kmask = offs < K
    x = tl.load(X + x_rows[:, None] + offs[None, :], mask=row_ok[:, None] & kmask[None, :], other=0.0)
    if NORM:
        g = tl.load(LnW + offs, mask=kmask, other=0.0)
        x = (x.to(tl.float32) * rstd[:, None]).to(x.dtype) * g[None, :]
    return x


@triton.jit
def _products(X, x_rows, row_ok, rstd, LnW, W, n_a, n_b, n_ok, K: tl.constexpr, NORM: tl.constexpr,
              TWO: tl.constexpr, IEEE: tl.constexpr, GEMV: tl.constexpr, BLOCK_K: tl.constexpr):
    """x [BB, K] (rows at x_rows, normed when NORM) times the weight rows n_a (and n_b when TWO) [BN] of W [*, K]:
    ([BB, BN], [BB, BN]) float32 (the second zeros without TWO).

    GEMV (BB == 1): elementwise products summed once at the end, the loop unrolled so that every weight load is
    in flight at once (a step of a few streams waits on memory latency, not on arithmetic). Otherwise tl.dot tiles,
    a small matrix product per program."""
    BN: tl.constexpr = n_a.shape[0]
    if GEMV:
        acc_a = tl.zeros([BN, BLOCK_K], dtype=tl.float32)
        acc_b = tl.zeros([BN, BLOCK_K], dtype=tl.float32)
        for k0 in tl.static_range(0, K, BLOCK_K):
            offs = k0 + tl.arange(0, BLOCK_K)
            wmask = n_ok[:, None] & (offs < K)[None, :]
            x = _x_block(X, x_rows, row_ok, offs, K, rstd, LnW, NORM)
            w_a = tl.load(W + n_a[:, None] * K + offs[None, :], mask=wmask, other=0.0)
            x = x.to(w_a.dtype).to(tl.float32)  # [1, BK]
            acc_a += w_a.to(tl.float32) * x
            if TWO:
                w_b = tl.load(W + n_b[:, None] * K + offs[None, :], mask=wmask, other=0.0)
                acc_b += w_b.to(tl.float32) * x
        return tl.sum(acc_a, 1)[None, :], tl.sum(acc_b, 1)[None, :]
    else:
        acc_a = tl.zeros([x_rows.shape[0], BN], dtype=tl.float32)
        acc_b = tl.zeros([x_rows.shape[0], BN], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs = k0 + tl.arange(0, BLOCK_K)
            wmask = n_ok[:, None] & (offs < K)[None, :]
            x = _x_block(X, x_rows, row_ok, offs, K, rstd, LnW, NORM)
            w_a = tl.load(W + n_a[:, None] * K + offs[None, :], mask=wmask, other=0.0)
            x = x.to(w_a.dtype)
            if IEEE:
                acc_a += tl.dot(x, tl.trans(w_a), input_precision="ieee")
            else:
                acc_a += tl.dot(x, tl.trans(w_a))
            if TWO:
                w_b = tl.load(W + n_b[:, None] * K + offs[None, :], mask=wmask, other=0.0)
                if IEEE:
                    acc_b += tl.dot(x, tl.trans(w_b), input_precision="ieee")
                else:
                    acc_b += tl.dot(x, tl.trans(w_b))
        return acc_a, acc_b


@triton.jit
def _rope_pair(lo, hi, t, InvFreq, d, rope_scale):
    """Hugging Face's rotate_half rotation at positions t [BB] of pairs (d, d + D/2) of a head, held as lo, hi
    [BB, P] (d: [P], the pairs' first indices)."""
    ang = t.to(tl.float32)[:, None] * tl.load(InvFreq + d)[None, :]
    c = tl.cos(ang) * rope_scale
    s = tl.sin(ang) * rope_scale
    return lo * c - hi * s, hi * c + lo * s


# --- kernels ------------------------------------------------------------------------------------------------------
@triton.jit
def _qkv_rope_kernel(
    X, Ids, Hout, LnW, W, Bias, QN, KN, InvFreq, Pos, Window, Q, QS, KC, VC,
    B, stride_x, H, H_kv, sinks, wmax, stride_cb, stride_ch, stride_cn, eps, rope_scale,
    K: tl.constexpr, HEAD_DIM: tl.constexpr, PAIRS: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr,
    FROM_IDS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_QK_NORM: tl.constexpr, IEEE: tl.constexpr,
    GEMV: tl.constexpr, USE_PDL: tl.constexpr, LINE: tl.constexpr, PF_LINES: tl.constexpr,
):
    # x: [B, K] (FROM_IDS: the embedding table [V, K], rows ids[b]); w: [(H + 2 H_kv) * D, K]; q, qs: [B, H, D];
    # kc, vc: [B', H_kv, C, D]; pos: [B] int64 (tokens before this one); window: [] int64 (<= 0: the whole ring)
    # grid ((H + 2 H_kv) * D / (2 PAIRS), cdiv(B, BLOCK_B)): program (i, .) makes PAIRS rotation pairs (d, d + D/2)
    # of head j = i // (D / 2 PAIRS) of the packed Q/K/V rows (HAS_QK_NORM: the whole head, PAIRS = D / 2)
    HALF: tl.constexpr = HEAD_DIM // 2
    PER_HEAD: tl.constexpr = HALF // PAIRS
    j = tl.program_id(0) // PER_HEAD
    d = (tl.program_id(0) % PER_HEAD) * PAIRS + tl.arange(0, PAIRS)  # d: [P], the pairs' first indices
    if USE_PDL:  # this program's weight rows (the pairs' two halves) into L2 while the kernel before finishes
        r0 = (j * HEAD_DIM + (tl.program_id(0) % PER_HEAD) * PAIRS).to(tl.int64)
        prefetch_l2(W + r0 * K, PAIRS * K, LINE, PF_LINES)
        prefetch_l2(W + (r0 + HALF) * K, PAIRS * K, LINE, PF_LINES)
    dependent_start(USE_PDL)
    bs = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = bs < B
    if FROM_IDS:
        x_rows = tl.load(Ids + bs, mask=row_ok, other=0).to(tl.int64) * stride_x
    else:
        x_rows = bs.to(tl.int64) * stride_x
    rstd = _rstd(X, x_rows, row_ok, K, eps, BLOCK_K)
    n_lo = (j * HEAD_DIM + d).to(tl.int64)
    acc_lo, acc_hi = _products(X, x_rows, row_ok, rstd, LnW, W, n_lo, n_lo + HALF, d < HALF, K, True, True, IEEE,
                               GEMV, BLOCK_K)
    if FROM_IDS:  # the residual stream starts as the embedding rows: one program column writes it
        if tl.program_id(0) == 0:
            for k0 in tl.static_range(0, K, BLOCK_K):
                offs = k0 + tl.arange(0, BLOCK_K)
                m = row_ok[:, None] & (offs < K)[None, :]
                xr = tl.load(X + x_rows[:, None] + offs[None, :], mask=m, other=0.0)
                tl.store(Hout + bs.to(tl.int64)[:, None] * K + offs[None, :], xr, mask=m)
    if HAS_BIAS:
        acc_lo += tl.load(Bias + n_lo).to(tl.float32)[None, :]
        acc_hi += tl.load(Bias + n_lo + HALF).to(tl.float32)[None, :]
    lo = acc_lo.to(Q.dtype.element_ty).to(tl.float32)  # the eager step rounds the product to the model's dtype
    hi = acc_hi.to(Q.dtype.element_ty).to(tl.float32)
    t = tl.load(Pos + bs, mask=row_ok, other=0).to(tl.int32)  # [BB]: the new token's position
    w = tl.load(Window).to(tl.int32)
    w = tl.where((w <= 0) | (w > wmax), wmax, w)
    ok = row_ok[:, None]
    if j < H + H_kv:
        if HAS_QK_NORM:  # Qwen3: RMSNorm over each head before the rotation
            r = 1.0 / tl.sqrt((tl.sum(lo * lo, 1) + tl.sum(hi * hi, 1)) / HEAD_DIM + eps)
            if j < H:
                g_lo, g_hi = tl.load(QN + d).to(tl.float32), tl.load(QN + d + HALF).to(tl.float32)
            else:
                g_lo, g_hi = tl.load(KN + d).to(tl.float32), tl.load(KN + d + HALF).to(tl.float32)
            lo = (lo * r[:, None]).to(Q.dtype.element_ty).to(tl.float32) * g_lo[None, :]
            hi = (hi * r[:, None]).to(Q.dtype.element_ty).to(tl.float32) * g_hi[None, :]
        r_lo, r_hi = _rope_pair(lo, hi, t, InvFreq, d, rope_scale)
        if j < H:  # a query head: at t, and at min(t, sinks + W) for the sink rows
            q_off = bs.to(tl.int64)[:, None] * (H * HEAD_DIM) + j * HEAD_DIM + d[None, :]
            tl.store(Q + q_off, r_lo.to(Q.dtype.element_ty), mask=ok)
            tl.store(Q + q_off + HALF, r_hi.to(Q.dtype.element_ty), mask=ok)
            s_lo, s_hi = _rope_pair(lo, hi, tl.minimum(t, sinks + w), InvFreq, d, rope_scale)
            tl.store(QS + q_off, s_lo.to(QS.dtype.element_ty), mask=ok)
            tl.store(QS + q_off + HALF, s_hi.to(QS.dtype.element_ty), mask=ok)
        else:
            lo, hi = r_lo, r_hi
    if j >= H:  # a key (rotated above) or value head: its row of the ring (edgeattn.attention.ring)
        hk = tl.where(j < H + H_kv, j - H, j - H - H_kv)
        row = tl.where(t < sinks, t, sinks + (t - sinks) % wmax)
        c_off = bs.to(tl.int64)[:, None] * stride_cb + hk * stride_ch + row.to(tl.int64)[:, None] * stride_cn \
            + d[None, :]
        if j < H + H_kv:
            tl.store(KC + c_off, lo.to(KC.dtype.element_ty), mask=ok)
            tl.store(KC + c_off + HALF, hi.to(KC.dtype.element_ty), mask=ok)
        else:
            tl.store(VC + c_off, lo.to(VC.dtype.element_ty), mask=ok)
            tl.store(VC + c_off + HALF, hi.to(VC.dtype.element_ty), mask=ok)


@triton.jit
def _linear_residual_kernel(
    X, W, Hres, B, N, stride_x,
    K: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
    GEMV: tl.constexpr, USE_PDL: tl.constexpr, LINE: tl.constexpr, PF_LINES: tl.constexpr,
):
    # x: [B, K]; w: [N, K]; h: [B, N], updated in place: h += round(x @ w^T); grid (cdiv(N, BLOCK_N), cdiv(B, BLOCK_B))
    if USE_PDL:
        n0 = tl.program_id(0) * BLOCK_N
        prefetch_l2(W + n0.to(tl.int64) * K, tl.minimum(BLOCK_N, N - n0) * K, LINE, PF_LINES)
    dependent_start(USE_PDL)
    ns = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    bs = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok, n_ok = bs < B, ns < N
    x_rows = bs.to(tl.int64) * stride_x
    rstd = tl.zeros([BLOCK_B], dtype=tl.float32)  # no norm
    n = tl.where(n_ok, ns, 0).to(tl.int64)
    acc, _ = _products(X, x_rows, row_ok, rstd, W, W, n, n, n_ok, K, False, False, IEEE, GEMV, BLOCK_K)
    h_off = bs.to(tl.int64)[:, None] * N + ns[None, :]
    ok = row_ok[:, None] & n_ok[None, :]
    h = tl.load(Hres + h_off, mask=ok, other=0.0)
    tl.store(Hres + h_off, h + acc.to(h.dtype), mask=ok)


@triton.jit
def _gate_up_kernel(
    X, LnW, W, Act, B, N, eps,
    K: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
    GEMV: tl.constexpr, USE_PDL: tl.constexpr, LINE: tl.constexpr, PF_LINES: tl.constexpr,
):
    # x: [B, K] (h); w: [2 N, K] (gate rows, then up rows); act: [B, N] = silu(gate) * up
    # grid (cdiv(N, BLOCK_N), cdiv(B, BLOCK_B))
    if USE_PDL:
        n0 = tl.program_id(0) * BLOCK_N
        rows = tl.minimum(BLOCK_N, N - n0) * K
        prefetch_l2(W + n0.to(tl.int64) * K, rows, LINE, PF_LINES)
        prefetch_l2(W + (n0 + N).to(tl.int64) * K, rows, LINE, PF_LINES)
    dependent_start(USE_PDL)
    ns = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    bs = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok, n_ok = bs < B, ns < N
    x_rows = bs.to(tl.int64) * K
    rstd = _rstd(X, x_rows, row_ok, K, eps, BLOCK_K)
    n = tl.where(n_ok, ns, 0).to(tl.int64)
    gate, up = _products(X, x_rows, row_ok, rstd, LnW, W, n, n + N, n_ok, K, True, True, IEEE, GEMV, BLOCK_K)
    dt = Act.dtype.element_ty
    g = gate.to(dt).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(dt) * up.to(dt)  # silu in float32, rounded, times the rounded up
    tl.store(Act + bs.to(tl.int64)[:, None] * N + ns[None, :], act, mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def _lm_head_kernel(
    X, LnW, W, Logits, PartV, PartI, B, V, eps, n_blocks,
    K: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
    GEMV: tl.constexpr, USE_PDL: tl.constexpr, LINE: tl.constexpr, PF_LINES: tl.constexpr,
):
    # x: [B, K] (h); w: [V, K]; logits: [B, V]; part_v, part_i: [B, n_blocks] (each block's largest logit and its
    # first index); grid (n_blocks, cdiv(B, BLOCK_B))
    pid_n = tl.program_id(0)
    if USE_PDL:
        prefetch_l2(W + (pid_n * BLOCK_N).to(tl.int64) * K, tl.minimum(BLOCK_N, V - pid_n * BLOCK_N) * K, LINE,
                    PF_LINES)
    dependent_start(USE_PDL)
    ns = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    bs = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok, n_ok = bs < B, ns < V
    x_rows = bs.to(tl.int64) * K
    rstd = _rstd(X, x_rows, row_ok, K, eps, BLOCK_K)
    n = tl.where(n_ok, ns, 0).to(tl.int64)
    acc, _ = _products(X, x_rows, row_ok, rstd, LnW, W, n, n, n_ok, K, True, False, IEEE, GEMV, BLOCK_K)
    logits = acc.to(Logits.dtype.element_ty)
    tl.store(Logits + bs.to(tl.int64)[:, None] * V + ns[None, :], logits, mask=row_ok[:, None] & n_ok[None, :])
    vals = tl.where(n_ok[None, :], logits.to(tl.float32), float("-inf"))  # the argmax of what sampling sees
    best = tl.argmax(vals, 1, tie_break_left=True)
    part = bs.to(tl.int64) * n_blocks + pid_n
    tl.store(PartV + part, tl.max(vals, 1), mask=row_ok)
    tl.store(PartI + part, pid_n * BLOCK_N + best, mask=row_ok)


@triton.jit
def _argmax_kernel(PartV, PartI, Out, n_blocks, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    # part_v, part_i: [B, n_blocks]; out: [B] int64, the first index of the largest logit; grid (B,)
    dependent_start(USE_PDL)
    b = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    live = offs < n_blocks
    v = tl.load(PartV + b * n_blocks + offs, mask=live, other=float("-inf"))
    best = tl.argmax(v, 0, tie_break_left=True)  # blocks in vocabulary order: the first block wins a tie
    tl.store(Out + b, tl.load(PartI + b * n_blocks + best).to(tl.int64))


# --- tiles and launches -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FusedTiles:
    """Tiles of one batch bucket. gemv: one stream a program (block_b 1), elementwise products with unrolled loads;
    else tl.dot tiles of block_b streams. block_n_*: output rows a program makes of the hidden-sized products (o,
    down), of the gate/up product and of the LM head; block_k: the reduction step; pairs: rotation pairs (d, d + D/2)
    a Q/K/V program makes (0: the whole head); warps: num_warps of the product kernels; pdl: launch each kernel as a
    programmatic dependent of the one before (Hopper and newer), its weights fetched into L2 before it waits."""

    gemv: bool
    block_b: int
    block_n_hidden: int
    block_n_inter: int
    block_n_vocab: int
    block_k: int = 64
    pairs: int = 0
    warps: int = 4
    pdl: bool = False  # programmatic dependent launch (dependent_launch.py): set per device by with_device

    def __post_init__(self) -> None:
        smallest = 1 if self.gemv else 16  # tl.dot's smallest tile side
        for name in ("block_b", "block_n_hidden", "block_n_inter", "block_n_vocab", "block_k", "pairs"):
            v = getattr(self, name)
            if (v or smallest) < smallest or v & (v - 1):
                raise ValueError(f"{name}: expected a power of two >= {smallest}, found {v}")
        if self.gemv and self.block_b != 1:
            raise ValueError(f"block_b: expected 1 with gemv (one stream a program), found {self.block_b}")


# batch bucket (largest batch it serves) -> tiles; the last row serves every larger batch. H200 sweeps (SmolLM2-135M's
# shape, context 8,192, W=1024, benchmarks/cuda_step_h200.py, GPU time a step). 2026-12-02, plain launches: batch 1
# went from 1.02 ms to 0.93 with 8 rows a program in the hidden-sized products (more programs, more loads in
# flight), to 0.93 with 128-wide reduction steps, 0.95 with both, then 0.90 with 4 rows; 8 gate/up rows (0.99),
# 4 rotation pairs (0.95) and 128 vocabulary rows (0.97) did not help, 2 warps lost (1.41). 2026-12-03, with
# dependent launches: batch 64 with tiles of 64 streams 2.03 ms (W=1024), of 16 streams 2.20, of 32 streams with
# 16 hidden rows, 32 gate/up rows and 16 rotation pairs a program 1.78, against 1.85 for torch.compile + cuBLAS
# ("linked"); at W=256 1.14 against 1.27; with the whole ring (8,192) 7.14 against 6.81.
FUSED_TILES: tuple[tuple[int, FusedTiles], ...] = (
    (4, FusedTiles(gemv=True, block_b=1, block_n_hidden=4, block_n_inter=16, block_n_vocab=64, block_k=128,
                   pairs=8)),
    (1 << 30, FusedTiles(gemv=False, block_b=32, block_n_hidden=16, block_n_inter=32, block_n_vocab=128, pairs=16)),
)
GEMV_MAX_BATCH = FUSED_TILES[0][0]  # above: tl.dot tiles, which need a head_dim >= 32


def fused_tiles(batch: int, device=None) -> FusedTiles:
    """The tiles of the batch bucket serving `batch` streams (FUSED_TILES), with programmatic dependent launch where
    `device` supports it (dependent_launch.dependent_launch)."""
    tiles = next(tiles for most, tiles in FUSED_TILES if batch <= most)
    return replace(tiles, pdl=True) if device is not None and dependent_launch(device) else tiles


def _pdl(tiles: FusedTiles, w, rows: int, k: int) -> dict:
    """The dependent-launch arguments of one product kernel: USE_PDL, the prefetch of `rows` weight rows of k
    elements, and the launch attribute itself (only when on: the interpreter knows no such option)."""
    line, lines = lines_of(rows * k, w.element_size())
    args = dict(USE_PDL=tiles.pdl, LINE=line, PF_LINES=lines)
    if tiles.pdl:
        args["launch_pdl"] = True
    return args


def _ieee(t) -> bool:
    import torch

    return t.dtype == torch.float32


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def qkv_rope(x, ids, h_out, ln, wqkv, bias, qn, kn, inv_freq, positions, window, q, q_sink, k_cache, v_cache, *,
             heads: int, kv_heads: int, sinks: int, eps: float, rope_scale: float, tiles: FusedTiles,
             from_ids: bool) -> None:
    """Norm + packed Q/K/V product + rotation into q, q_sink [B, H, D]; the new key and value rows written into
    k_cache, v_cache [B', H_kv, C, D]. from_ids: x is the embedding table, the rows are ids, and h_out [B, hidden]
    receives them (the residual stream's start)."""
    b, d = q.shape[0], q.shape[2]
    wmax = k_cache.shape[2] - sinks
    pairs = d // 2 if qn is not None or not tiles.pairs else min(tiles.pairs, d // 2)  # head norms: whole heads
    grid = ((heads + 2 * kv_heads) * (d // 2 // pairs), _cdiv(b, tiles.block_b))
    _qkv_rope_kernel[grid](
        x, ids, h_out, ln, wqkv, bias if bias is not None else wqkv, qn if qn is not None else ln,
        kn if kn is not None else ln, inv_freq, positions, window, q, q_sink, k_cache, v_cache,
        b, x.stride(0), heads, kv_heads, int(sinks), int(wmax), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), float(eps), float(rope_scale),
        K=x.shape[1], HEAD_DIM=d, PAIRS=pairs, BLOCK_B=tiles.block_b, BLOCK_K=tiles.block_k, FROM_IDS=from_ids,
        HAS_BIAS=bias is not None, HAS_QK_NORM=qn is not None, IEEE=_ieee(wqkv), GEMV=tiles.gemv,
        num_warps=tiles.warps, **_pdl(tiles, wqkv, pairs, x.shape[1]),
    )


def linear_residual(x, w, h, *, tiles: FusedTiles) -> None:
    """h [B, N] += x [B, K] @ w [N, K]^T (in place)."""
    b, k = x.shape
    n = w.shape[0]
    grid = (_cdiv(n, tiles.block_n_hidden), _cdiv(b, tiles.block_b))
    _linear_residual_kernel[grid](x, w, h, b, n, x.stride(0), K=k, BLOCK_B=tiles.block_b,
                                  BLOCK_N=tiles.block_n_hidden, BLOCK_K=tiles.block_k, IEEE=_ieee(w),
                                  GEMV=tiles.gemv, num_warps=tiles.warps, **_pdl(tiles, w, tiles.block_n_hidden, k))


def gate_up(h, ln, wgu, act, *, eps: float, tiles: FusedTiles) -> None:
    """act [B, I] = silu(gate) * up of RMSNorm(h) with gate and up packed in wgu [2 I, hidden]."""
    b, k = h.shape
    n = act.shape[1]
    grid = (_cdiv(n, tiles.block_n_inter), _cdiv(b, tiles.block_b))
    _gate_up_kernel[grid](h, ln, wgu, act, b, n, float(eps), K=k, BLOCK_B=tiles.block_b,
                          BLOCK_N=tiles.block_n_inter, BLOCK_K=tiles.block_k, IEEE=_ieee(wgu), GEMV=tiles.gemv,
                          num_warps=tiles.warps, **_pdl(tiles, wgu, tiles.block_n_inter, k))


def lm_head(h, ln, w, *, eps: float, tiles: FusedTiles, greedy: bool):
    """RMSNorm(h) @ w^T -> logits [B, V] in h's dtype, or with greedy the first index of each row's largest
    logit, [B] int64 (two launches; the logits are written either way)."""
    import torch

    b, k = h.shape
    v = w.shape[0]
    n_blocks = _cdiv(v, tiles.block_n_vocab)
    logits = torch.empty((b, v), device=h.device, dtype=h.dtype)
    part_v = torch.empty((b, n_blocks), device=h.device, dtype=torch.float32)
    part_i = torch.empty((b, n_blocks), device=h.device, dtype=torch.int32)
    _lm_head_kernel[(n_blocks, _cdiv(b, tiles.block_b))](
        h, ln, w, logits, part_v, part_i, b, v, float(eps), n_blocks, K=k, BLOCK_B=tiles.block_b,
        BLOCK_N=tiles.block_n_vocab, BLOCK_K=tiles.block_k, IEEE=_ieee(w), GEMV=tiles.gemv, num_warps=tiles.warps,
        **_pdl(tiles, w, tiles.block_n_vocab, k))
    if not greedy:
        return logits
    out = torch.empty((b,), device=h.device, dtype=torch.int64)
    extra = {"launch_pdl": True} if tiles.pdl else {}
    _argmax_kernel[(b,)](part_v, part_i, out, n_blocks, BLOCK=max(16, triton.next_power_of_2(n_blocks)),
                         USE_PDL=tiles.pdl, **extra)
    return out


# --- ahead of time -------------------------------------------------------------------------------------------------
AOT_KINDS = ("fused_embed_qkv_rope", "fused_qkv_rope", "fused_linear_residual", "fused_gate_up", "fused_lm_head",
             "fused_argmax")
# the kernels' pointer parameters that are not the model's dtype
_AOT_POINTERS = {"Ids": "*i64", "Pos": "*i64", "Window": "*i64", "InvFreq": "*fp32", "PartV": "*fp32",
                 "PartI": "*i32", "Out": "*i64"}


def aot_kernel(kind: str, dtype: str, head_dim: int, features: int):
    """(jit kernel, constexprs, num_warps, num_stages, grid rule, parameter types) of one fused kernel compiled ahead
    of time with the small-batch tiles (FUSED_TILES' first row; no Q/K/V bias, no per-head norms: Llama's layout).
    features: what the product reduces over, a compile-time shape (the hidden size; the down projection's: the
    intermediate size; the argmax's: the vocabulary). dtype: the model's, as a Triton pointer type ("*bf16")."""
    tiles = FUSED_TILES[0][1]
    common = dict(K=features, BLOCK_B=tiles.block_b, BLOCK_K=tiles.block_k, IEEE=False, GEMV=tiles.gemv,
                  USE_PDL=False, LINE=64, PF_LINES=1)  # ahead of time: plain launches (the AOT launcher's)
    scalars = {"eps": "fp32", "rope_scale": "fp32"}
    if kind in ("fused_embed_qkv_rope", "fused_qkv_rope"):
        pairs = min(tiles.pairs or head_dim // 2, head_dim // 2)
        const = dict(common, HEAD_DIM=head_dim, PAIRS=pairs, FROM_IDS=kind == "fused_embed_qkv_rope",
                     HAS_BIAS=False, HAS_QK_NORM=False)
        fn, grid = _qkv_rope_kernel, f"((H + 2 * H_kv) * {head_dim // 2 // pairs}, B, 1)"
    elif kind == "fused_linear_residual":
        const = dict(common, BLOCK_N=tiles.block_n_hidden)
        fn, grid = _linear_residual_kernel, f"(cdiv(N, {tiles.block_n_hidden}), B, 1)"
    elif kind == "fused_gate_up":
        const = dict(common, BLOCK_N=tiles.block_n_inter)
        fn, grid = _gate_up_kernel, f"(cdiv(N, {tiles.block_n_inter}), B, 1)"
    elif kind == "fused_lm_head":
        const = dict(common, BLOCK_N=tiles.block_n_vocab)
        fn, grid = _lm_head_kernel, f"(cdiv(V, {tiles.block_n_vocab}), B, 1)"
    elif kind == "fused_argmax":
        const = dict(BLOCK=max(16, triton.next_power_of_2(_cdiv(features, tiles.block_n_vocab))), USE_PDL=False)
        fn, grid = _argmax_kernel, "(B, 1, 1)"
    else:
        raise ValueError(f"fused kernel kind: expected one of {AOT_KINDS}, found {kind!r}")
    types = {}
    for name in fn.arg_names:
        if name in const:
            continue
        if name in scalars:
            types[name] = scalars[name]
        elif name[0].isupper() and name not in ("B", "H", "H_kv", "N", "V"):  # pointers are capitalised, sizes too
            types[name] = _AOT_POINTERS.get(name, dtype)
        else:
            types[name] = "i32"
    return fn, const, tiles.warps, 3, grid, types


__all__ = ["AOT_KINDS", "FUSED_TILES", "GEMV_MAX_BATCH", "FusedTiles", "aot_kernel", "fused_tiles", "gate_up", "linear_residual",
           "lm_head", "qkv_rope"]
