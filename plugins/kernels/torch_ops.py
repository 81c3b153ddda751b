"""`torch.ops.edgeattn.windowed_attention`: the torch custom op over the Triton kernels.

Importing this module registers the op (once). Schema (docs/kernels.md):

    edgeattn::windowed_attention(Tensor q, Tensor k, Tensor v, Tensor window, int sinks=0,
                                 bool causal=True, float scale=0., Tensor? key_padding_mask=None) -> Tensor

q: [B, H, S_q, D]; k, v: [B, H_kv, S_k, D]; window: integer scalar tensor (0 or >= S_k: full).
CUDA tensors run the Triton kernels (plugins/kernels/dispatch.py picks one), reading the window on the device
(no host sync, no recompile when it changes). Other devices run the PyTorch reference
(edgeattn/attention/reference.py), which reads the window on the host. A fake (meta) kernel makes the
op traceable by torch.compile / torch.export.
"""

from __future__ import annotations

from edgeattn.attention.reference import windowed_attention_torch
from edgeattn.errors import InputError
from edgeattn.optional import require

torch = require("torch", "the edgeattn torch op")

OP_NAME = "edgeattn::windowed_attention"


def _check_window_value(window) -> None:
    if window.dtype.is_floating_point or window.numel() != 1:
        raise InputError(f"window: expected an integer scalar tensor, found {window.dtype} {tuple(window.shape)}")
    if window.device.type == "cpu" and int(window.reshape(())) < 0:
        raise InputError(f"window: expected >= 0, found {int(window.reshape(()))}")


@torch.library.custom_op(OP_NAME, mutates_args=())
def windowed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: torch.Tensor,
                       sinks: int = 0, causal: bool = True, scale: float = 0.0,
                       key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Reference implementation for non-CUDA devices (dense; reads the window on the host)."""
    _check_window_value(window)
    return windowed_attention_torch(q, k, v, int(window.reshape(())), sinks=sinks, causal=causal,
                                    scale=scale, key_padding_mask=key_padding_mask)


@windowed_attention.register_kernel("cuda")
def _windowed_attention_cuda(q, k, v, window, sinks=0, causal=True, scale=0.0, key_padding_mask=None):
    from edgeattn.plugins.kernels.dispatch import windowed_attention as triton_windowed_attention  # loads triton

    _check_window_value(window)
    if window.device != q.device:
        window = window.to(q.device, non_blocking=True)
    return triton_windowed_attention(q, k, v, window, sinks=sinks, causal=causal, scale=scale,
                                     key_padding_mask=key_padding_mask)


@windowed_attention.register_fake
def _windowed_attention_fake(q, k, v, window, sinks=0, causal=True, scale=0.0, key_padding_mask=None):
    return torch.empty_like(q)


__all__ = ["OP_NAME", "windowed_attention"]
