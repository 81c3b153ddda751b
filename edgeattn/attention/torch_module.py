"""edgeattn::WindowedAttention in PyTorch: checked inputs, eager compute, and export to the ONNX op.

On CUDA in fp16/bf16 it runs the Triton kernels (torch.ops.edgeattn.windowed_attention); otherwise
eagerly it computes the reference (docs/windowed-attention.md). Under `torch.onnx.export(..., dynamo=True)`
it emits one `edgeattn::WindowedAttention` node (torch.onnx.ops.symbolic); `edgeattn.export` then attaches
the op's ONNX function so ONNX Runtime can run the model.
"""

from __future__ import annotations

import torch

from edgeattn.attention import DOMAIN, OP_TYPE, OPSET_VERSION
from edgeattn.attention.onnx_node import PLUGIN_NAMESPACE, check_attributes
from edgeattn.attention.reference import windowed_attention_torch
from edgeattn.errors import InputError
from edgeattn.plugins.kernels import torch_ops  # noqa: F401  registers torch.ops.edgeattn.windowed_attention


def check_inputs(q, k, v, window, key_padding_mask=None) -> None:
    """Shapes and types of the spec; raises InputError saying what was expected and found."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise InputError(f"q, k, v: expected 4-D [B, H, S, D] tensors, found {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape:
        raise InputError(f"k and v: expected the same shape [B, H_kv, S_k, D], found {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise InputError(f"q {tuple(q.shape)} and k {tuple(k.shape)}: expected the same batch and head size")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise InputError(f"heads: expected H ({q.shape[1]}) to be a multiple of H_kv ({k.shape[1]})")
    if q.shape[2] > k.shape[2]:
        raise InputError(f"sequence: expected S_q ({q.shape[2]}) <= S_k ({k.shape[2]})")
    if isinstance(window, torch.Tensor):
        if window.dtype.is_floating_point or window.dtype == torch.bool or window.numel() != 1:
            raise InputError(f"window: expected an integer scalar, found a {window.dtype} tensor of shape {tuple(window.shape)}")
    elif not isinstance(window, int) or isinstance(window, bool):
        raise InputError(f"window: expected an int, found {type(window).__name__} {window!r}")
    if key_padding_mask is not None and tuple(key_padding_mask.shape) != (k.shape[0], k.shape[2]):
        raise InputError(f"key_padding_mask: expected shape [B, S_k] = {(k.shape[0], k.shape[2])}, "
                         f"found {tuple(key_padding_mask.shape)}")


def windowed_attention(q, k, v, window, key_padding_mask=None, *, causal: bool = True, sinks: int = 0,
                       scale: float = 0.0):
    """q: [B, H, S_q, D], k/v: [B, H_kv, S_k, D], window: int or int64 scalar tensor -> [B, H, S_q, D]."""
    check_attributes(causal, sinks, scale)
    check_inputs(q, k, v, window, key_padding_mask)
    if torch.onnx.is_in_onnx_export():
        w = window if isinstance(window, torch.Tensor) else torch.tensor(window)
        w = w.reshape(()).to(torch.int64)
        attrs = {"causal": int(causal), "sinks": int(sinks), "scale": float(scale),
                 "plugin_namespace": PLUGIN_NAMESPACE}
        return torch.onnx.ops.symbolic(f"{DOMAIN}::{OP_TYPE}", [q, k, v, w, key_padding_mask], attrs,
                                       dtype=q.dtype, shape=q.shape, version=OPSET_VERSION)
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        w = window if isinstance(window, torch.Tensor) else torch.tensor(int(window), dtype=torch.int64)
        if not isinstance(window, torch.Tensor) and int(window) < 0:
            raise InputError(f"window: expected >= 0 (0 = full attention), found {int(window)}")
        return torch.ops.edgeattn.windowed_attention(q, k, v, w.to(q.device, torch.int64), sinks, causal, scale,
                                                     key_padding_mask)
    w = int(window)
    if w < 0:
        raise InputError(f"window: expected >= 0 (0 = full attention), found {w}")
    return windowed_attention_torch(q, k, v, w, sinks=sinks, causal=causal, scale=scale,
                                    key_padding_mask=key_padding_mask)


class WindowedAttention(torch.nn.Module):
    """The attention op as a module: forward(q, k, v, window, key_padding_mask=None)."""

    def __init__(self, causal: bool = True, sinks: int = 0, scale: float = 0.0):
        super().__init__()
        check_attributes(causal, sinks, scale)
        self.causal, self.sinks, self.scale = bool(causal), int(sinks), float(scale)

    def forward(self, q, k, v, window, key_padding_mask=None):
        return windowed_attention(q, k, v, window, key_padding_mask, causal=self.causal, sinks=self.sinks,
                                  scale=self.scale)

    def extra_repr(self) -> str:
        return f"causal={self.causal}, sinks={self.sinks}, scale={self.scale}"
