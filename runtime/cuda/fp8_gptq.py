"""FP8 weights rounded with error feedback (GPTQ, arXiv 2210.17323, on the E4M3 grid) instead of to nearest.

Rounding each weight to the nearest E4M3 value (3 mantissa bits) moves SmolLM2-135M's perplexity by about 2%;
most of it is the down projections. GPTQ rounds a matrix one input column at a time and moves the error of
that column onto the columns not yet rounded, weighted by how the layer's inputs correlate (the Hessian
H = X^T X of the product's inputs X on calibration text), so the product's output moves less than the weights
do. The grid is unchanged: one scale per output row (amax / 448), E4M3 values, the same bytes and kernels as
round-to-nearest; only which neighbour each weight takes differs.

    hessians = input_hessians(packed, prompts)          # "wqkv.0" -> [K, K] fp32, from the decoder's prefill
    w8, scale = round_gptq(w, hessians["wqkv.0"])       # fp8.quantize_weight's result, error-compensated

The inputs are those of the bf16 decoder itself (every product of `fp8.linear` during a prefill), so one
calibration pass serves every matrix. The calibration text is the build's (cuda_build: lee_background, or
`--calibration FILE`); the held-out text of the quality docs is never used.
"""

from __future__ import annotations

from edgeattn.errors import BuildError
from edgeattn.optional import require
from edgeattn.runtime.cuda import fp8

torch = require("torch", "FP8 weights with error feedback")

DAMP = 0.01  # of the mean diagonal, added to H (a column that no input reached would make H singular)
BLOCK = 128  # columns rounded together before their error is carried to the rest (the GPTQ paper's lazy batch)
MIN_TOKENS = 256  # fewer calibration tokens than this give a Hessian too thin to trust


def input_hessians(packed, prompts, *, max_tokens: int = 1024) -> tuple[dict, int]:
    """Run each prompt (token ids) through `packed`'s prefill and sum X^T X of every per-layer product's input
    -> ({"wqkv.i" | "wo.i" | "wgu.i" | "wd.i": [K, K] fp32 on the weights' device}, tokens seen)."""
    from edgeattn.runtime.cuda.prefill import prefill_logits

    names = {id(w): f"{name}.{i}" for name in fp8.MATRICES for i, w in enumerate(packed.t[name])}
    sums: dict[str, object] = {}
    tokens = 0

    def tap(x, w):
        name = names.get(id(w))
        if name is not None:
            x2 = x.detach().reshape(-1, x.shape[-1]).float()
            sums[name] = sums[name] + x2.T @ x2 if name in sums else x2.T @ x2

    limit = min(max_tokens, packed.shape.window_max)
    for ids in prompts:
        ids = list(ids)[:limit]
        if not ids:
            continue
        keys, values = packed.new_cache(1)
        with fp8.tapped(tap), torch.no_grad():
            prefill_logits(packed, torch.tensor(ids, device=packed.device), 0, 0, keys, values, 0)
        tokens += len(ids)
    if tokens < MIN_TOKENS:
        raise BuildError(f"fp8 weights with error feedback: expected at least {MIN_TOKENS} calibration tokens, "
                         f"found {tokens}; give more text (--calibration) or round to nearest (--fp8-rounding nearest)")
    return sums, tokens


def round_gptq(w, hessian, *, what: str = "weight", damp: float = DAMP, block: int = BLOCK):
    """w [N, K] -> (w8 [N, K] float8_e4m3fn, scale [N] fp32) on fp8.quantize_weight's grid (row amax / 448),
    each column rounded after the error of the columns before it was fed forward through the inverse Hessian."""
    _, scale = fp8.quantize_weight(w, what)  # checks the scales (finite, nonzero) before any work
    work = w.detach().float().clone()
    n, k = work.shape
    h = hessian.detach().double().clone()
    if h.shape != (k, k):
        raise BuildError(f"fp8 weights with error feedback: expected a [{k}, {k}] Hessian for {what}, "
                         f"found {list(h.shape)}")
    dead = torch.diagonal(h) == 0  # inputs that were always zero: their weights cannot matter, keep H invertible
    h[dead, dead] = 1.0
    h += damp * torch.diagonal(h).mean() * torch.eye(k, dtype=h.dtype, device=h.device)
    try:  # the upper Cholesky factor of H^-1: row i holds how column i's error spreads to columns > i
        hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True).float()
    except RuntimeError as exc:  # not positive definite even damped: NaN or inf inputs
        raise BuildError(f"fp8 weights with error feedback: the calibration inputs of {what} give a Hessian that is "
                         f"not positive definite ({exc}); nothing written") from None
    s = scale[:, None].to(work.device)
    out = torch.empty((n, k), dtype=torch.float8_e4m3fn, device=work.device)
    for a in range(0, k, block):
        b = min(a + block, k)
        cols, errs, hb = work[:, a:b].clone(), torch.empty((n, b - a), device=work.device), hinv[a:b, a:b]
        for i in range(b - a):
            q8 = (cols[:, i:i + 1] / s).clamp(-fp8.E4M3_MAX, fp8.E4M3_MAX).to(torch.float8_e4m3fn)
            out[:, a + i] = q8[:, 0]
            err = (cols[:, i] - q8[:, 0].float() * s[:, 0]) / hb[i, i]
            cols[:, i:] -= err[:, None] * hb[i, i:][None]
            errs[:, i] = err
        work[:, b:] -= errs @ hinv[a:b, b:]
    return out, scale


def rounder(hessians: dict):
    """fp8.quantize_state_dict's `rounder`: each matrix rounded with error feedback from its Hessian."""
    return lambda w, name: round_gptq(w, hessians[name], what=name)


def output_error(w, w8, scale, hessian) -> float:
    """The relative error of the product's output on the calibration inputs, tr(E H E^T) / tr(W H W^T),
    E = dequantized - original: what `inspect` reports per rounding."""
    w32 = w.detach().float()
    e = fp8.dequantize(w8, scale, torch.float32) - w32
    h = hessian.float()
    return float(((e @ h) * e).sum() / ((w32 @ h) * w32).sum().clamp_min(1e-30))


__all__ = ["BLOCK", "DAMP", "MIN_TOKENS", "input_hessians", "output_error", "round_gptq", "rounder"]
