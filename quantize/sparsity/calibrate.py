"""Calibrated 2:4 masks: choose the pruned weights and update the kept ones from input statistics.

For each Linear, one pass over calibration batches collects the Gram matrix G = X^T X of its inputs
(X: [tokens, K]); H = G + damping. Then the optimal-brain-surgeon recipe of SparseGPT (Frantar &
Alistarh, 2023), written here from the paper: walk the columns of W in order; at the start of every
group of 4 prune the 2 weights with the smallest w^2 / [H^-1]_jj^2; the error a pruned (or kept) column
leaves is spread onto the columns not yet visited through the Cholesky factor of H^-1, so the pruned
layer keeps reproducing the dense layer's outputs on the calibration inputs. Inputs come from the dense
model in one pass (not layer by layer from the pruned one): simpler, and fine-tuning corrects the rest.
"""

from __future__ import annotations

from typing import Callable, Iterable

from edgeattn.optional import require
from edgeattn.quantize.sparsity.two_four import apply_mask_, two_four_mask

DAMP = 0.01  # ridge term, as a share of mean(diag G)
BLOCK = 128  # columns updated eagerly; the rest get one matrix product per block


def collect_grams(model, linears: dict, batches: Iterable[dict], runner: Callable | None = None) -> dict:
    """name -> G = X^T X (float64, [K, K]) of each Linear's input over the calibration batches.

    `runner(model, batch)` runs one batch (default: `model(**batch)` on the model's device)."""
    torch = require("torch", "calibrated 2:4 masks")
    grams = {name: torch.zeros(m.in_features, m.in_features, dtype=torch.float64, device=m.weight.device)
             for name, m in linears.items()}  # on each layer's device (a CUDA model prunes on the GPU)
    device = next(model.parameters()).device

    def hook(name):
        def fn(module, args):
            x = args[0].detach().reshape(-1, module.in_features).double()  # x: [tokens, K]
            grams[name] += x.T @ x
        return fn

    handles = [m.register_forward_pre_hook(hook(name)) for name, m in linears.items()]
    try:
        with torch.no_grad():
            for batch in batches:
                if runner is not None:
                    runner(model, batch)
                else:
                    model(**{k: v.to(device) for k, v in batch.items()})
    finally:
        for h in handles:
            h.remove()
    return grams


def _inverse_factor(gram):
    """Upper Cholesky factor U of H^-1 (H = G + damping), or None when G carries no information."""
    torch = require("torch")
    k = gram.shape[0]
    mean_diag = float(gram.diagonal().mean())
    if not bool(torch.isfinite(gram).all()) or mean_diag <= 0:
        return None
    h = gram + DAMP * mean_diag * torch.eye(k, dtype=gram.dtype, device=gram.device)
    dead = gram.diagonal() == 0  # channels that never fire: any value is as good
    h[dead, dead] = 1.0
    chol, info = torch.linalg.cholesky_ex(h)
    if int(info):
        return None
    return torch.linalg.cholesky(torch.cholesky_inverse(chol), upper=True).float()


def prune_two_four(weight, gram):
    """(pruned weight, kept mask) for W [N, K]: 2 of every 4 along K kept, the rest compensated."""
    torch = require("torch")
    n, k = weight.shape
    u = _inverse_factor(gram)
    if u is None:  # no usable statistics (the layer never ran): plain magnitude masking
        mask = two_four_mask(weight)
        return weight * mask, mask
    w = weight.detach().float().clone().to(u.device)  # w: [N, K], updated in place as columns are visited
    pruned = torch.zeros(n, k, dtype=torch.bool, device=w.device)
    for b0 in range(0, k, BLOCK):
        b1 = min(b0 + BLOCK, k)
        wb, ub = w[:, b0:b1].clone(), u[b0:b1, b0:b1]  # [N, B], [B, B]
        errs = torch.zeros_like(wb)
        for j in range(b1 - b0):
            if j % 4 == 0:  # choose this group's 2 pruned weights by the OBS saliency
                saliency = wb[:, j:j + 4] ** 2 / ub.diagonal()[j:j + 4] ** 2  # [N, 4]
                drop = saliency.topk(2, dim=1, largest=False).indices
                pruned[:, b0 + j:b0 + j + 4].scatter_(1, drop, True)
            col = wb[:, j]
            q = torch.where(pruned[:, b0 + j], torch.zeros_like(col), col)
            err = (col - q) / ub[j, j]
            wb[:, j:] -= err.unsqueeze(1) * ub[j, j:].unsqueeze(0)
            wb[:, j] = q
            errs[:, j] = err
        w[:, b0:b1] = wb
        w[:, b1:] -= errs @ u[b0:b1, b1:]
    mask = ~pruned
    return (w * mask).to(weight.device, weight.dtype), mask.to(weight.device)


def prune_layer_(linear, gram) -> None:
    """Prune `linear` 2:4 in place from its input Gram matrix: compensated weight copied in, mask applied."""
    weight, mask = prune_two_four(linear.weight.detach(), gram)
    linear.weight.copy_(weight)
    apply_mask_(linear, mask)
