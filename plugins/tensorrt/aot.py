"""TensorRT (>= 10.9) plugin for edgeattn::WindowedAttention: `tensorrt.plugin` with an ahead-of-time impl.

`register()` registers the plugin `edgeattn::WindowedAttention` (needs full TensorRT: Jetson or a
data-center GPU; the kernel is compiled for the GPU that builds the engine). The ONNX parser maps a node of that domain and op_type to it. The engine holds
the Triton PTX returned by `@trtp.aot_impl`, so running it needs no Python.

Contract (docs/kernels.md):
  inputs   q [B, H, S_q, D], k, v [B, H_kv, S_k, D] (fp16 or bf16, contiguous), window: int64 [] or [1]
  output   [B, H, S_q, D], q's dtype
  attributes causal (int), sinks (int), scale (float; 0 = 1/sqrt(D))
The window is an input TENSOR, read by the kernel on the device: AOT plugins do not serialize
attributes, and the thermal runtime changes the window between runs. causal / sinks / scale are fixed
when the engine is built, so they are compiled into the PTX as constants. The 5-input form with a
key_padding_mask is not offered by this plugin (the JIT torch op supports it).

Written against NVIDIA's documented `tensorrt.plugin` API; it has NOT been run (full TensorRT does not
install on the development machines and the lent H200 has no TensorRT). `launch_for` below is plain
Python, tested on CPU with integer shapes. Open points for the first GPU run: Triton appends two hidden
scratch-pointer parameters that TensorRT does not pass (unused by these kernels), and tiles needing more
than 48 KiB of shared memory need the launcher to raise the kernel's dynamic shared-memory limit.
"""

from __future__ import annotations

from edgeattn.errors import InputError
from edgeattn.optional import require
from edgeattn.plugins.kernels.aot import CompiledKernel, KernelVariant, compile_variant, prefill_launch

PLUGIN_ID = "edgeattn::WindowedAttention"


def variant_for(dtype: str, head_dim: int, causal: int, sinks: int, scale: float) -> KernelVariant:
    """The prefill variant an engine gets: attributes compiled in, window left as a tensor input."""
    return KernelVariant("prefill", dtype, int(head_dim), causal=bool(causal), sinks=int(sinks),
                         scale=float(scale) if scale else float(int(head_dim)) ** -0.5)


def launch_for(kernel: CompiledKernel, q_shape, k_shape) -> tuple[tuple, list]:
    """(grid, int32 scalar args) for a prefill kernel; shapes may be TensorRT shape expressions."""
    return prefill_launch(kernel, q_shape, k_shape)


def _current_arch() -> int:
    import triton

    target = triton.runtime.driver.active.get_current_target()
    return int(target.arch)


def register() -> None:
    """Register the plugin with TensorRT's plugin registry (idempotent per process)."""
    from typing import Tuple

    trt = require("tensorrt", "the TensorRT AOT attention plugin")
    trtp = require("tensorrt.plugin", "the TensorRT AOT attention plugin")

    @trtp.register(PLUGIN_ID)
    def _describe(q: trtp.TensorDesc, k: trtp.TensorDesc, v: trtp.TensorDesc, window: trtp.TensorDesc,
                  causal: int, sinks: int, scale: float) -> trtp.TensorDesc:
        return q.like()  # out: [B, H, S_q, D]

    @trtp.autotune(PLUGIN_ID)
    def _formats(q, k, v, window, outputs):
        return [trtp.AutoTuneCombination("FP16, FP16, FP16, INT64, FP16"),
                trtp.AutoTuneCombination("BF16, BF16, BF16, INT64, BF16")]

    @trtp.aot_impl(PLUGIN_ID)
    def _aot(q: trtp.TensorDesc, k: trtp.TensorDesc, v: trtp.TensorDesc, window: trtp.TensorDesc,
             causal: int, sinks: int, scale: float, outputs: Tuple[trtp.TensorDesc], tactic: int):
        dtypes = {trt.float16: "fp16", trt.bfloat16: "bf16"}
        if q.dtype not in dtypes:
            raise InputError(f"{PLUGIN_ID}: expected fp16 or bf16 q, found {q.dtype}")
        head_dim = q.shape_expr[3]
        if not head_dim.is_constant:
            raise InputError(f"{PLUGIN_ID}: the head dim must be static, found a dynamic one")
        kernel = compile_variant(variant_for(dtypes[q.dtype], head_dim.constant_value, causal, sinks, scale),
                                 _current_arch())
        grid, scalars = launch_for(kernel, tuple(q.shape_expr), tuple(k.shape_expr))
        params = trtp.KernelLaunchParams()
        params.grid_x, params.grid_y, params.grid_z = grid
        params.block_x = kernel.num_warps * 32
        params.shared_mem = kernel.shared
        extra = trtp.SymIntExprs.from_tuple([trtp.SymInt32(x) for x in scalars])
        return kernel.name.encode(), kernel.ptx.encode(), params, extra


__all__ = ["PLUGIN_ID", "launch_for", "register", "variant_for"]
