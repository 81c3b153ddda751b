"""FP8 E4M3 linear layers for the cuda target (Hopper sm_90, Thor sm_110, Ada sm_89): weights quantized per
output row at build, activations per token at run time, one `torch._scaled_mm` with both scale vectors.

    tensors = quantize_state_dict(packed.state_dict(), layers)   # build: wqkv.0 -> fp8 + wqkv.0.scale (fp32)
    tensors = fp8_weights(tensors)                                # open: wqkv.0 -> (w8, scale [1, N], bf16 or None)
    y = linear(x, tensors["wqkv.0"])                              # fp8 or bf16, chosen per shape and token count

A weight row's scale is amax / 448 (E4M3's largest finite value); a scale that is not finite or is zero stops
the build. Where the choice table (fp8_table.py, measured on an H200) says FP8 does not pay for a matrix's
(K, N) at a product's token count (small batches of small matrices), the product runs in bf16 on a copy of the
same FP8-rounded weights, so a stream's numbers do not depend on which path its batch took beyond the
activation rounding. The LM head and the embedding stay bf16.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

from edgeattn.errors import BuildError, TargetError
from edgeattn.optional import require
from edgeattn.runtime.cuda.fp8_table import TABLE

torch = require("torch", "FP8 on the cuda target")

E4M3_MAX = 448.0
MIN_SM = 89  # FP8 tensor cores: Ada sm_89, Hopper sm_90, Blackwell and Thor; not Ampere nor Orin (sm_87)
MIN_GAIN = 1.05  # FP8 is chosen where the table says it is at least 5% faster than bf16
PAD_M = 16  # torch._scaled_mm: K and N multiples of 16; the token count is padded to one too
MATRICES = ("wqkv", "wo", "wgu", "wd")  # per layer; the LM head and the embedding stay bf16
_TAP = None  # tapped(): a function that sees every product's input (fp8_gptq.input_hessians while it calibrates)


def check_fp8_gpu(name: str, sm: int, what: str) -> None:
    """A TargetError naming the GPU when it has no FP8 tensor cores (sm < 89)."""
    if sm < MIN_SM:
        raise TargetError(f"{what}: FP8 needs a GPU of sm_{MIN_SM} or later (Ada, Hopper, Thor), found {name} "
                          f"(sm_{sm}), which supports bf16, fp16 and int8: rebuild with --precision bf16")


def quantize_weight(w, what: str):
    """w [N, K] -> (w8 [N, K] float8_e4m3fn, scale [N] fp32), scale = row amax / 448."""
    w32 = w.detach().float()
    amax = w32.abs().amax(dim=1)
    scale = amax / E4M3_MAX
    bad = ~torch.isfinite(scale) | (scale <= 0)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise BuildError(f"fp8 weights: expected every row of {what} to have a finite, nonzero scale (amax / 448), "
                         f"found row {row} with amax {float(amax[row])} ({int(bad.sum())} such rows); nothing written")
    w8 = (w32 / scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return w8, scale


def quantize_state_dict(tensors: dict, layers: int, rounder=None, progress=None) -> dict:
    """A packed state dict (decode_step.PackedDecoder.state_dict) with its per-layer matrices in FP8: each
    `name.i` becomes float8_e4m3fn and gains `name.i.scale` (fp32 [N]). `rounder(w, name) -> (w8, scale)`:
    how a matrix is rounded (fp8_gptq.rounder: with error feedback), to nearest by default. `progress(done,
    total)` after each matrix."""
    out = dict(tensors)
    total = len(MATRICES) * layers
    for n, (name, i) in enumerate((name, i) for name in MATRICES for i in range(layers)):
        key = f"{name}.{i}"
        out[key], out[f"{key}.scale"] = (rounder or quantize_weight)(tensors[key], key)
        if progress is not None:
            progress(n + 1, total)
    return out


@contextmanager
def tapped(fn):
    """Within the block, `fn(x, w)` sees the input of every `linear` before the product runs."""
    global _TAP
    before, _TAP = _TAP, fn
    try:
        yield
    finally:
        _TAP = before


def dequantize(w8, scale, dtype):
    """[N, K] in `dtype`: what the FP8 weights stand for."""
    return (w8.float() * scale.reshape(-1, 1)).to(dtype)


def fp8_weights(tensors: dict, dtype=None) -> dict:
    """Tensors as read from a bundle -> the decode step's form: every `name.i` with a `name.i.scale` becomes a
    tuple (w8 [N, K], scale [1, N] fp32, a `dtype` copy for the token counts where bf16 wins, else None)."""
    dtype = dtype or tensors["embed"].dtype
    out = {k: v for k, v in tensors.items() if not k.endswith(".scale")}
    for key, w in tensors.items():
        if f"{key}.scale" in tensors:
            scale = tensors[f"{key}.scale"].float()
            n, k = w.shape
            needs_bf16 = any(choice(m, k, n) == "bf16" for m in TABLE["tokens"])
            out[key] = (w, scale.reshape(1, -1).contiguous(), dequantize(w, scale, dtype) if needs_bf16 else None)
    return out


def bucket(tokens: int) -> int:
    """The table's token count for a product of `tokens` rows: the largest bucket <= tokens (at least the first)."""
    chosen = TABLE["tokens"][0]
    for m in TABLE["tokens"]:
        if m <= tokens:
            chosen = m
    return chosen


def _row(k: int, n: int) -> list[float]:
    """The table's speedups for (K, N), or for the measured shape nearest in K * N (log scale)."""
    rows = TABLE["speedup"]
    if f"{k}x{n}" in rows:
        return rows[f"{k}x{n}"]
    near = min(rows, key=lambda s: abs(math.log(math.prod(int(d) for d in s.split("x")) / (k * n))))
    return rows[near]


def choice(tokens: int, k: int, n: int) -> str:
    """"fp8" or "bf16" for a [tokens, K] x [K, N] product, from the table."""
    if k % PAD_M or n % PAD_M:
        return "bf16"  # torch._scaled_mm cannot take it
    speedup = _row(k, n)[TABLE["tokens"].index(bucket(tokens))]
    return "fp8" if speedup >= MIN_GAIN else "bf16"


def linear(x, w, bias=None):
    """x [..., K] @ w.T (+ bias): w a tensor (plain F.linear) or an FP8 tuple from fp8_weights."""
    if _TAP is not None:
        _TAP(x, w)
    if not isinstance(w, tuple):
        return torch.nn.functional.linear(x, w, bias)
    w8, scale, fallback = w
    n, k = w8.shape
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if fallback is not None and choice(m, k, n) == "bf16":
        return torch.nn.functional.linear(x, fallback, bias)
    out = _fp8_mm(x2, w8, scale, x.dtype)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], n)


def _fp8_mm(x2, w8, w_scale, dtype):
    import edgeattn.plugins.kernels.fp8_quant  # noqa: F401  (registers torch.ops.edgeattn.quantize_rows_fp8)

    m = x2.shape[0]
    rows = -(-m // PAD_M) * PAD_M
    x8, x_scale = torch.ops.edgeattn.quantize_rows_fp8(x2, rows)  # x8: [rows, K] fp8; x_scale: [rows, 1]
    if x2.is_cuda:
        out = torch._scaled_mm(x8, w8.t(), scale_a=x_scale, scale_b=w_scale, out_dtype=dtype)
    else:  # the same arithmetic in float32 (CPU tests)
        out = ((x8.float() * x_scale) @ (w8.float() * w_scale.reshape(-1, 1)).t()).to(dtype)
    return out[:m]


def matrix_shapes(shape) -> dict:
    """(K, N) of each per-layer matrix of a decode_step.DecoderShape."""
    s, d = shape, shape.head_dim
    return {"wqkv": (s.hidden, (s.heads + 2 * s.kv_heads) * d), "wo": (s.heads * d, s.hidden),
            "wgu": (s.hidden, 2 * s.intermediate), "wd": (s.intermediate, s.hidden)}


def precision_plan(shape) -> dict:
    """The manifest's record: per matrix its (K, N) and "fp8" / "bf16" per token count, and the table it came
    from."""
    matrices = {name: {"k": k, "n": n, "by_tokens": {str(m): choice(m, k, n) for m in TABLE["tokens"]}}
                for name, (k, n) in matrix_shapes(shape).items()}
    matrices["lm_head"] = {"k": shape.hidden, "n": shape.vocab, "by_tokens": "bf16 (kept in bf16)"}
    table = {k: TABLE[k] for k in ("device", "measured", "how")}
    return {"matrices": matrices, "table": {**table, "min_gain": MIN_GAIN, "tokens": list(TABLE["tokens"])}}


__all__ = ["E4M3_MAX", "MATRICES", "MIN_SM", "bucket", "check_fp8_gpu", "choice", "dequantize", "fp8_weights",
           "linear", "matrix_shapes", "precision_plan", "quantize_state_dict", "quantize_weight", "tapped"]
