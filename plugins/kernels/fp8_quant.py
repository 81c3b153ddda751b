"""`torch.ops.edgeattn.quantize_rows_fp8`: per-row dynamic FP8 E4M3 quantization of activations in one kernel.

    x8, scale = torch.ops.edgeattn.quantize_rows_fp8(x, rows)   # x: [M, K] -> x8: [rows, K] fp8, scale: [rows, 1]

Each row's scale is amax / 448 (E4M3's largest finite value); rows M..rows-1 are zero with scale 1 (the
padding `torch._scaled_mm` wants). CUDA runs the Triton kernel (one program a row, the whole row in one block);
other devices run the same arithmetic in PyTorch, so tests run anywhere and torch.compile sees an opaque op.
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgeattn.optional import require

torch = require("torch", "FP8 activation quantization")

E4M3_MAX = 448.0  # largest finite float8_e4m3fn
TINY = 1e-12  # a row of zeros gets a tiny scale, not a division by zero
OP_NAME = "edgeattn::quantize_rows_fp8"
_MAX = tl.constexpr(E4M3_MAX)  # the same numbers as Triton compile-time constants
_TINY = tl.constexpr(TINY)


@triton.jit
def _quantize_rows_kernel(X, Y, S, M, K, stride_x, stride_y, BLOCK_K: tl.constexpr):
    # x: [M, K] (bf16/fp16/fp32); y: [rows, K] fp8e4nv; s: [rows] fp32; grid (rows,)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    live = (offs < K) & (row < M)
    x = tl.load(X + row * stride_x + offs, mask=live, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), 0)
    scale = tl.where(row < M, tl.maximum(amax, _TINY) / _MAX, 1.0)
    y = tl.clamp(x / scale, -_MAX, _MAX)
    tl.store(Y + row * stride_y + offs, y.to(tl.float8e4nv), mask=offs < K)
    tl.store(S + row, scale)


def quantize_rows_reference(x, rows: int):
    """The kernel's arithmetic in PyTorch: x [M, K] -> (x8 [rows, K] float8_e4m3fn, scale [rows, 1] fp32)."""
    x32 = x.float()
    scale = x32.abs().amax(dim=-1, keepdim=True).clamp_min(TINY) / E4M3_MAX
    x8 = (x32 / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    pad = rows - x.shape[0]
    if pad:
        x8 = torch.cat([x8, torch.zeros(pad, x.shape[1], dtype=x8.dtype, device=x.device)])
        scale = torch.cat([scale, torch.ones(pad, 1, device=x.device)])
    return x8, scale


@torch.library.custom_op(OP_NAME, mutates_args=())
def quantize_rows_fp8(x: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference for non-CUDA devices."""
    return quantize_rows_reference(x, rows)


@quantize_rows_fp8.register_kernel("cuda")
def _quantize_rows_cuda(x, rows):
    m, k = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    y = torch.empty(rows, k, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty(rows, 1, dtype=torch.float32, device=x.device)
    _quantize_rows_kernel[(rows,)](x, y, s, m, k, x.stride(0), y.stride(0), BLOCK_K=triton.next_power_of_2(k),
                                   num_warps=4 if k <= 4096 else 8)
    return y, s


@quantize_rows_fp8.register_fake
def _quantize_rows_fake(x, rows):
    return (x.new_empty(rows, x.shape[1], dtype=torch.float8_e4m3fn),
            x.new_empty(rows, 1, dtype=torch.float32))


__all__ = ["E4M3_MAX", "OP_NAME", "quantize_rows_fp8", "quantize_rows_reference"]
