"""Host-side pieces every launch wrapper shares: strides the kernels accept, the padding-mask argument,
the device's compute capability. torch is imported inside the functions (lazily)."""

from __future__ import annotations


def last_dim_contiguous(t):
    """t itself when its last dim has stride 1 (the kernels index it as offs_d), else a contiguous copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


def mask_argument(key_padding_mask, window):
    """The kernels' Mask argument: the [B, S_k] padding mask as contiguous int8 (1 = real token), or,
    with no mask, the window tensor as a placeholder pointer (HAS_PAD=False never reads it)."""
    import torch

    return key_padding_mask.to(torch.int8).contiguous() if key_padding_mask is not None else window


def device_arch(device) -> int:
    """Compute capability as a number (sm_90 -> 90); CPU tensors (TRITON_INTERPRET=1): 90."""
    import torch

    if device.type != "cuda":
        return 90  # the interpreter runs any tile: take the sm_90 tables
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


__all__ = ["device_arch", "last_dim_contiguous", "mask_argument"]
