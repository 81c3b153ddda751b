"""Fake quantizers and QuantLinear against plain PyTorch / NumPy references."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from edgeattn.errors import ConfigError
from edgeattn.quantize import FakeQuantizer, QuantLinear, W4Config, W8A8Config, calibrate, quantize_
from edgeattn.quantize.fake_quant import FP8_MAX, quantize_grid


def _calibrated(q: FakeQuantizer, x: torch.Tensor) -> FakeQuantizer:
    q.calibrating = True
    q(x)
    q.finish_calibration()
    return q


def test_per_channel_int8_matches_numpy_reference():
    w = torch.randn(6, 40)
    q = _calibrated(FakeQuantizer("int8", "channel", "max"), w)
    ref = w.numpy().astype(np.float64)
    s = np.abs(ref).max(1, keepdims=True) / 127
    want = np.clip(np.round(ref / s), -128, 127) * s
    np.testing.assert_allclose(q(w).detach().numpy(), want, atol=1e-6)


def test_block_int4_has_one_scale_per_block_of_inputs():
    w = torch.randn(4, 64)
    w[:, 32:] *= 100  # the second block of every row is large: its scale must not spoil the first block
    q = _calibrated(FakeQuantizer("int4", 32, "max"), w)
    assert q.scale.shape == (8,)
    err = (q(w) - w).abs().detach()
    assert err[:, :32].max() < 0.5 * w[:, :32].abs().max() / 7 + 1e-6


def test_observers_set_the_clipping_range():
    x = torch.randn(20000)
    x[0] = 60.0
    q = {obs: _calibrated(FakeQuantizer("int8", "tensor", obs, percentile=99.9), x) for obs in ("max", "mse", "percentile")}
    assert q["max"].scale.item() == pytest.approx(60.0 / 127, rel=1e-5)
    want = np.percentile(np.abs(x.numpy()), 99.9)
    assert q["percentile"].scale.item() * 127 == pytest.approx(want, rel=1e-3)
    err = {k: ((v(x) - x) ** 2).mean().item() for k, v in q.items()}
    assert err["mse"] < err["max"]


def test_fp8_grid_is_e4m3():
    x = torch.linspace(-3, 3, 101)
    q = _calibrated(FakeQuantizer("fp8", "tensor", "max"), x)
    y = quantize_grid(x, q.scale, "fp8").detach()
    assert torch.equal(y, y.to(torch.float8_e4m3fn).float())
    assert y.abs().max() <= FP8_MAX


def test_straight_through_and_learned_step_gradients():
    torch.manual_seed(0)
    x = torch.randn(64, requires_grad=True)
    q = _calibrated(FakeQuantizer("int8", "tensor", "percentile", percentile=90.0), x.detach())
    q(x).pow(2).sum().backward()
    r = x.detach() / q.scale.detach()
    inside, clipped = r.abs() < 126.5, (r > 127.5) | (r < -128.5)
    np.testing.assert_allclose(x.grad[inside].numpy(), (2 * q(x.detach()))[inside].detach().numpy(), rtol=1e-5)
    assert clipped.any() and torch.all(x.grad[clipped] == 0)  # clipped values get no gradient
    assert q.log_scale.grad is not None and q.log_scale.grad.abs() > 0


def test_quantizer_refuses_use_before_calibration():
    with pytest.raises(RuntimeError, match="before calibration"):
        FakeQuantizer("int8", "tensor", "max")(torch.ones(3))


def test_quantize_replaces_linears_and_keeps_overrides_in_float():
    from edgeattn.quantize import LayerOverride

    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32))
    report = quantize_(model, W8A8Config(overrides=(LayerOverride("2", None),)))
    assert isinstance(model[0], QuantLinear) and isinstance(model[2], nn.Linear)
    assert report.quantized == {"0": "w8a8"} and "2" in report.float_layers


def test_bad_block_size_is_refused_before_any_change():
    model = nn.Sequential(nn.Linear(96, 8))
    with pytest.raises(ConfigError, match="block size 64 does not divide the input dimension of 0 \\(96\\)"):
        quantize_(model, W4Config(block_size=64))
    assert isinstance(model[0], nn.Linear)


class _Mask(nn.Module):
    def __init__(self, mask):
        super().__init__()
        self.register_buffer("mask", mask)

    def forward(self, w):
        return w * self.mask


def test_parametrized_weight_is_what_gets_quantized_and_zeros_stay_zero():
    torch.manual_seed(0)
    lin = nn.Linear(64, 16)
    mask = (torch.rand(16, 64) > 0.5).float()  # stands in for a 2:4 sparsity mask
    nn.utils.parametrize.register_parametrization(lin, "weight", _Mask(mask))
    model = nn.Sequential(lin)
    quantize_(model, W4Config(block_size=32))
    calibrate(model, [{"input": torch.randn(4, 64)}])
    ql = model[0]
    wq = ql.weight_quantizer(ql.weight)
    assert torch.all(wq[mask == 0] == 0)
    ref = ql.linear.parametrizations.weight.original * mask
    assert torch.allclose(ql.weight, ref)
    ql.freeze_for_export()
    assert torch.all(ql.qdq_weight.t()[mask == 0] == 0)
