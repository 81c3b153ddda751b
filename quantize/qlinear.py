"""QuantLinear: a Linear with fake-quantized weight (and input activation), exportable as Q/DQ ONNX.

The wrapped Linear stays a child, and its weight is always read through `linear.weight`, so a weight
parametrization (a 2:4 sparsity mask, see quantize/sparsity*) is applied before quantization; symmetric
quantization keeps zeros zero.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from edgeattn.quantize.config import QuantConfig
from edgeattn.quantize.fake_quant import FakeQuantizer

_ONNX_TYPE = {"int8": torch.int8, "int4": torch.int8, "fp8": torch.float8_e4m3fn}


class QuantLinear(nn.Module):
    def __init__(self, linear: nn.Linear, config: QuantConfig) -> None:
        super().__init__()
        self.linear = linear
        self.config = config
        self.fmt, group = config.weight_format, config.weight_group
        if isinstance(group, int) != (self.fmt == "int4"):
            raise ValueError(f"{config.name}: expected block-wise scales for int4 and per-channel ones for int8 "
                             f"and fp8 (what the Q/DQ export writes), found {self.fmt} with group {group!r}")
        if isinstance(group, int) and linear.in_features % group:
            raise ValueError(f"block size {group} does not divide in_features {linear.in_features}")
        self.weight_quantizer = FakeQuantizer(self.fmt, group, config.weight_observer, config.percentile,
                                              config.learn_scales)
        self.input_quantizer = None
        if config.quantize_inputs:
            self.input_quantizer = FakeQuantizer(self.fmt, "tensor", config.act_observer, config.percentile,
                                                 config.learn_scales)
        self.exporting = False

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.exporting and torch.onnx.is_in_onnx_export():
            return self._forward_qdq(x)
        w = self.weight_quantizer(self.linear.weight)  # through the parametrization, if any
        if self.input_quantizer is not None:
            x = self.input_quantizer(x)
        return F.linear(x, w, self.linear.bias)

    # -- export -------------------------------------------------------------------------------
    @torch.no_grad()
    def freeze_for_export(self) -> None:
        """Store the quantized weight as an integer (or fp8) buffer laid out [in, out] for MatMul(x, W)."""
        wq = self.weight_quantizer
        w = self.linear.weight.detach().float()  # [out, in]
        s = wq.scale.detach().clamp_min(1e-12)
        if self.fmt == "int4":
            g = w.reshape(w.shape[0], -1, wq.group)
            q = torch.clamp(torch.round(g / s.reshape(g.shape[0], -1, 1)), -8, 7).reshape(w.shape)
            scale = s.reshape(w.shape[0], -1).t().contiguous()  # [in / block, out]
        elif self.fmt == "fp8":
            q = torch.clamp(w / s.reshape(-1, 1), -448, 448)
            scale = s.reshape(-1)
        else:
            q = torch.clamp(torch.round(w / s.reshape(-1, 1)), -128, 127)
            scale = s.reshape(-1)
        qt = q.t().contiguous().to(_ONNX_TYPE[self.fmt])  # [in, out]
        self.register_buffer("qdq_weight", qt, persistent=False)
        self.register_buffer("qdq_weight_scale", scale.float(), persistent=False)
        self.register_buffer("qdq_weight_zero", torch.zeros_like(scale, dtype=_ONNX_TYPE[self.fmt]), persistent=False)
        if self.input_quantizer is not None:
            self.register_buffer("qdq_input_scale", self.input_quantizer.scale.detach().clamp_min(1e-12).float().reshape(()),
                                 persistent=False)
            self.register_buffer("qdq_input_zero", torch.zeros((), dtype=_ONNX_TYPE[self.fmt]), persistent=False)
        self.exporting = True

    def _forward_qdq(self, x: torch.Tensor) -> torch.Tensor:
        sym = torch.onnx.ops.symbolic
        version = 21 if self.fmt == "int4" else 19
        attrs = {"axis": 0, "block_size": self.weight_quantizer.group} if self.fmt == "int4" else {"axis": 1}
        w = sym("DequantizeLinear", [self.qdq_weight, self.qdq_weight_scale, self.qdq_weight_zero], attrs,
                dtype=torch.float32, shape=self.qdq_weight.shape, version=version)
        if self.input_quantizer is not None:
            q = sym("QuantizeLinear", [x, self.qdq_input_scale, self.qdq_input_zero], {},
                    dtype=_ONNX_TYPE[self.fmt], shape=x.shape, version=version)
            x = sym("DequantizeLinear", [q, self.qdq_input_scale, self.qdq_input_zero], {},
                    dtype=torch.float32, shape=x.shape, version=version)
        y = torch.matmul(x, w)
        return y + self.linear.bias if self.linear.bias is not None else y

    def extra_repr(self) -> str:
        return f"{self.config.name}, in={self.linear.in_features}, out={self.linear.out_features}"
