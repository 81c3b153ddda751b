"""Calibrated 2:4 masks: choose and refit the kept weights from the layer's input statistics.

For each Linear, one pass over calibration batches collects the Gram matrix G = X^T X of its inputs
(X: [tokens, K]). The mask keeps, in every group of 4, the 2 weights of largest |w_j| * sqrt(G_jj) (the
Wanda score: magnitude times input-channel norm). The kept weights of each output row are then refit by
least squares so the pruned row reproduces the dense row's outputs on the calibration inputs:
    w_S = argmin || X_S w_S - X w ||^2  =>  G_SS w_S = G_S: w   (S = kept columns, damped).
Inputs come from the dense model (one pass), not layer-by-layer from the pruned one: simpler, and
fine-tuning corrects the rest.
"""

from __future__ import annotations

from typing import Iterable

from edgeattn.optional import require

DAMP = 0.01  # ridge term, as a share of mean(diag G)
ROW_CHUNK = 64  # rows solved together: chunk * (K/2)^2 floats at a time


def collect_grams(model, linears: dict, batches: Iterable[dict]) -> dict:
    """name -> G = X^T X (float64, [K, K]) of each Linear's input over the calibration batches."""
    torch = require("torch", "calibrated 2:4 masks")
    grams = {name: torch.zeros(m.in_features, m.in_features, dtype=torch.float64) for name, m in linears.items()}

    def hook(name):
        def fn(module, args):
            x = args[0].detach().reshape(-1, module.in_features).double()  # x: [tokens, K]
            grams[name] += x.T @ x
        return fn

    handles = [m.register_forward_pre_hook(hook(name)) for name, m in linears.items()]
    try:
        with torch.no_grad():
            for batch in batches:
                model(**batch)
    finally:
        for h in handles:
            h.remove()
    return grams


def wanda_mask(weight, gram):
    """Keep the 2 of every 4 along K with the largest |w| * ||x_j||. weight: [N, K] -> mask [N, K]."""
    torch = require("torch")
    n, k = weight.shape
    score = weight.abs() * gram.diagonal().clamp_min(0).sqrt().to(weight.dtype)  # [N, K]
    keep = score.reshape(n, k // 4, 4).topk(2, dim=-1).indices
    return torch.zeros(n, k // 4, 4, dtype=torch.bool).scatter_(-1, keep, True).reshape(n, k)


def refit(weight, mask, gram):
    """Least-squares values for the kept weights of each row (zeros elsewhere). -> [N, K]."""
    torch = require("torch")
    n, k = weight.shape
    w = weight.double()
    out = torch.zeros_like(w)
    if not bool(torch.isfinite(gram).all()) or float(gram.diagonal().mean()) <= 0:
        return (w * mask).to(weight.dtype)  # no usable statistics (layer never ran): plain masked weights
    g = gram + (DAMP * gram.diagonal().mean() + 1e-12) * torch.eye(k, dtype=gram.dtype)
    kept = mask.nonzero()[:, 1].reshape(n, k // 2)  # [N, K/2] kept column indices per row
    for r0 in range(0, n, ROW_CHUNK):
        idx = kept[r0:r0 + ROW_CHUNK]  # [R, K/2]
        g_ss = g[idx.unsqueeze(-1), idx.unsqueeze(-2)]  # [R, K/2, K/2]
        rhs = (g[idx] @ w[r0:r0 + ROW_CHUNK].unsqueeze(-1))  # [R, K/2, 1] = G_S: w
        chol, info = torch.linalg.cholesky_ex(g_ss)  # G_SS is symmetric positive definite (damped)
        solved = torch.cholesky_solve(rhs, chol)
        bad = (info != 0) | ~torch.isfinite(solved).all(-1).all(-1)
        fallback = w[r0:r0 + ROW_CHUNK].gather(1, idx).unsqueeze(-1)  # rows whose system failed: plain mask
        solved = torch.where(bad.reshape(-1, 1, 1), fallback, solved)
        out[r0:r0 + ROW_CHUNK].scatter_(1, idx, solved.squeeze(-1))
    return out.to(weight.dtype)
