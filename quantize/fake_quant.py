"""Fake quantizers with learned step sizes (LSQ) and a straight-through estimator.

A quantizer holds a positive step size `scale` per group (tensor, output channel or weight block),
initialised by an observer (max / percentile / MSE) and then trained as in LSQ (Esser et al. 2020):
rounding passes the gradient straight through, the step size gets the gradient of the quantization
error. The step is learned as log(scale), so it stays positive and Adam updates it in relative terms.
"""

from __future__ import annotations

import torch
from torch import nn

FP8_MAX = 448.0  # largest finite float8 e4m3fn
FORMATS = {"int8": (-128, 127), "int4": (-8, 7), "fp8": (-FP8_MAX, FP8_MAX)}


def _round_ste(x: torch.Tensor) -> torch.Tensor:
    return (torch.round(x) - x).detach() + x


def _fp8_ste(x: torch.Tensor) -> torch.Tensor:
    return (x.to(torch.float8_e4m3fn).to(x.dtype) - x).detach() + x


def quantize_grid(x: torch.Tensor, scale: torch.Tensor, fmt: str) -> torch.Tensor:
    """x / scale on the format's grid, clamped (integers for int8/int4, e4m3 values for fp8), with STE."""
    lo, hi = FORMATS[fmt]
    y = torch.clamp(x / scale, lo, hi)
    return _fp8_ste(y) if fmt == "fp8" else _round_ste(y)


class FakeQuantizer(nn.Module):
    """Symmetric fake quantizer. `group` is 'tensor', 'channel' (dim 0 of a weight) or a block size
    (groups of `group` consecutive inputs along dim 1 of a weight)."""

    def __init__(self, fmt: str, group: str | int, observer: str, percentile: float = 99.99,
                 learn: bool = True) -> None:
        super().__init__()
        self.fmt, self.group, self.observer, self.percentile = fmt, group, observer, percentile
        self.log_scale = nn.Parameter(torch.zeros(()), requires_grad=learn)
        self.calibrating = False
        self.calibrated = False
        self._stats: list[torch.Tensor] = []

    @property
    def scale(self) -> torch.Tensor:
        return self.log_scale.exp()

    @property
    def qmax(self) -> float:
        return FORMATS[self.fmt][1]

    def _grouped(self, x: torch.Tensor) -> torch.Tensor:
        """x viewed so that the last dim is one quantization group: [G..., n]."""
        if self.group == "tensor":
            return x.reshape(1, -1)
        if self.group == "channel":
            return x.reshape(x.shape[0], -1)
        return x.reshape(x.shape[0], x.shape[1] // self.group, self.group)

    def _scale_shape(self, x: torch.Tensor) -> torch.Tensor:
        if self.group == "tensor":
            return self.scale
        if self.group == "channel":
            return self.scale.reshape(-1, *([1] * (x.dim() - 1)))
        return self.scale.reshape(x.shape[0], -1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.calibrating:
            self._observe(x.detach())
            return x
        if not self.calibrated:
            raise RuntimeError("fake quantizer used before calibration: run edgeattn.quantize.calibrate first")
        s = self.scale
        if isinstance(self.group, int):
            g = self._grouped(x)
            return (quantize_grid(g, s.reshape(*g.shape[:-1], 1), self.fmt) * s.reshape(*g.shape[:-1], 1)).reshape(x.shape)
        s = self._scale_shape(x) if self.group == "channel" else s
        return quantize_grid(x, s, self.fmt) * s

    # -- calibration --------------------------------------------------------------------------
    def _observe(self, x: torch.Tensor) -> None:
        if self.group != "tensor":  # weights: one observation is the whole tensor
            self._stats = [x.float()]
            return
        flat = x.float().abs().flatten()
        if flat.numel() > 1 << 18:  # a fixed random sample keeps percentile / MSE cheap
            idx = torch.randint(0, flat.numel(), (1 << 18,), generator=torch.Generator().manual_seed(0))
            flat = flat[idx]
        self._stats.append(flat)

    @torch.no_grad()
    def finish_calibration(self) -> None:
        if not self._stats:
            raise RuntimeError("no data reached this quantizer during calibration")
        if self.group == "tensor":
            a = torch.cat(self._stats).reshape(1, -1)
        else:
            a = self._grouped(self._stats[0]).abs()
            a = a.reshape(-1, a.shape[-1])
        amax = self._amax(a).clamp_min(1e-8)  # [G]
        scale = (amax / self.qmax).reshape(-1) if self.group != "tensor" else (amax / self.qmax).reshape(())
        self.log_scale.data = scale.log()
        self._stats, self.calibrating, self.calibrated = [], False, True

    def _amax(self, a: torch.Tensor) -> torch.Tensor:
        """Clipping range per row of a [G, n] |x| sample."""
        top = a.amax(dim=1)
        if self.observer == "max":
            return top
        if self.observer == "percentile":
            return torch.quantile(a, self.percentile / 100.0, dim=1) if a.shape[1] <= 1 << 24 else top
        best, best_err = top.clone(), torch.full_like(top, float("inf"))
        for ratio in torch.linspace(0.3, 1.0, 36):  # MSE search over clipping ratios of the max
            amax = (top * ratio).clamp_min(1e-8)
            s = (amax / self.qmax).unsqueeze(1)
            q = torch.clamp(a / s, *FORMATS[self.fmt])
            q = q.to(torch.float8_e4m3fn).float() if self.fmt == "fp8" else torch.round(q)
            err = ((q * s - a) ** 2).mean(dim=1)
            better = err < best_err
            best, best_err = torch.where(better, amax, best), torch.where(better, err, best_err)
        return best

    def extra_repr(self) -> str:
        return f"{self.fmt}, group={self.group}, observer={self.observer}"
