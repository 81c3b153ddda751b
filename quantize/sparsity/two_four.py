"""2:4 masks on Linear weights: compute one, register it as a parametrization, find the masked layers, bake
the masks in.

The mask is a `torch.nn.utils.parametrize` parametrization on `Linear.weight`: every reader of `module.weight`
(forward, fake quantizers of QAT, export) sees the masked weight, and the masked entries get zero gradient.
Which layers get one, and how the kept weights are chosen, is `masks.sparsify_`'s (and calibrate.py's) job.
"""

from __future__ import annotations

import copy
from typing import Any

from edgeattn.optional import require


def two_four_mask(weight):
    """Boolean mask keeping the 2 largest |w| in every 4 consecutive entries along the last axis.

    weight: [N, K] with K % 4 == 0 -> mask: [N, K].
    """
    torch = require("torch", "2:4 sparsity")
    n, k = weight.shape
    groups = weight.detach().abs().reshape(n, k // 4, 4)  # [N, K/4, 4]
    keep = groups.topk(2, dim=-1).indices
    return torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True).reshape(n, k)


def kept_magnitude(weight) -> float:
    """Share of sum |w| that survives 2:4 pruning along the last axis."""
    total = float(weight.abs().sum())
    return float((weight.abs() * two_four_mask(weight)).sum()) / total if total else 1.0


def is_two_four(weight) -> bool:
    """True when every 4 consecutive entries along the last axis hold at least 2 zeros."""
    n, k = weight.shape
    return bool(((weight.reshape(n, k // 4, 4) == 0).sum(-1) >= 2).all())


def _mask_module():
    torch = require("torch", "2:4 sparsity")

    class TwoFourMask(torch.nn.Module):
        """Parametrization: weight -> weight * mask (mask: [N, K], 2 of every 4 along K kept)."""

        def __init__(self, mask):
            super().__init__()
            self.register_buffer("mask", mask)

        def forward(self, weight):
            return weight * self.mask.to(weight.dtype)

    return TwoFourMask


def apply_mask_(linear, mask) -> None:
    """Register a 2:4 mask on `linear.weight` (replacing any previous one)."""
    parametrize = require("torch.nn.utils.parametrize", "2:4 sparsity")
    if has_mask(linear):
        parametrize.remove_parametrizations(linear, "weight", leave_parametrized=False)
    parametrize.register_parametrization(linear, "weight", _mask_module()(mask))


def has_mask(module) -> bool:
    plist = getattr(module, "parametrizations", None)
    return plist is not None and "weight" in plist and any(
        type(p).__name__ == "TwoFourMask" for p in plist["weight"])


def masked_layers(model) -> dict[str, Any]:
    """name -> Linear for every module that carries a 2:4 mask."""
    return {name: m for name, m in model.named_modules() if has_mask(m)}


def strip_masks(model, *, inplace: bool = False):
    """A model whose Linear weights are the masked weights, without parametrizations (for export)."""
    parametrize = require("torch.nn.utils.parametrize", "2:4 sparsity")
    model = model if inplace else copy.deepcopy(model)
    for module in masked_layers(model).values():
        if not inplace:  # a deep copy shares the generated Parametrized* class: removing would break the source
            cls = module.__class__
            body = {k: v for k, v in cls.__dict__.items() if k not in ("__dict__", "__weakref__")}
            module.__class__ = type(cls.__name__, cls.__bases__, body)
        parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)
    return model
