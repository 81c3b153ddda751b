"""The FP8 E4M3 KV cache of the cuda target: per (layer, kv head) scales fixed at calibration.

A cached row holds k / k_scale and v / v_scale in float8_e4m3fn, half the bytes of bf16, so a long-context
decode step (which reads the cache, not the weights) reads half as much. The scales are fixed, not running:
a running amax would change the scale under rows already written. They are measured once, at build (or when
a bf16 bundle is opened with an FP8 cache), from a few prompts run through the decoder: scale = amax * MARGIN
/ 448 per layer and kv head, the margin leaving room for rows larger than the calibration saw (a larger one
saturates at +-448 * scale rather than overflowing).

    scales = fp8_build.calibrate(weights, prompts)   # [layers, 2, H_kv] fp32: keys [:, 0], values [:, 1]
    weights.t["kv_scale"] = scales                   # the decode step and prefill then read and write FP8 rows

Everything that writes the cache goes through `store` (decode step, prefill) and everything that reads it
through the FP8 ring kernel (plugins/kernels/ring_fp8.py) or `load`.
"""

from __future__ import annotations

from edgeattn.optional import require

torch = require("torch", "the FP8 KV cache")

E4M3_MAX = 448.0
MARGIN = 2.0  # headroom over the calibration's amax (fp8_build.calibrate)


def quantize(x, scale):
    """x [..., H_kv, D] -> float8_e4m3fn x / scale (scale [H_kv]), saturating at +-448."""
    return (x.float() / scale.float()[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def load(x8, scale, dtype):
    """FP8 rows [..., H_kv, L, D] (H_kv third from the end) -> `dtype`."""
    return (x8.float() * scale.float()[:, None, None]).to(dtype)


def roundtrip(x, scale):
    """x [..., H_kv, D] as the cache will give it back."""
    return (quantize(x, scale).float() * scale.float()[:, None]).to(x.dtype)


def store(cache, streams, rows, x, scale) -> None:
    """cache[streams, :, rows] = x [n, H_kv, D], quantized when `scale` [H_kv] is given (an FP8 cache)."""
    cache[streams, :, rows] = x.to(cache.dtype) if scale is None else quantize(x, scale)


def layer_scales(weights, i: int):
    """(k_scale, v_scale) [H_kv] of layer i, or (None, None) for a cache in the weights' float type."""
    kv = weights.t.get("kv_scale")
    return (None, None) if kv is None else (kv[i, 0], kv[i, 1])


def attend(q, q_s, k_cache, v_cache, k_scale, v_scale, positions, window, sinks: int, scale: float, splits: int):
    """The ring attention over rows already written: ring_ops.ring_attend, or its FP8 form."""
    if k_scale is None:
        import edgeattn.plugins.kernels.ring_ops  # noqa: F401  (registers the op)

        return torch.ops.edgeattn.ring_attend(q, q_s, k_cache, v_cache, positions, window, sinks, scale, splits)
    import edgeattn.plugins.kernels.ring_fp8  # noqa: F401  (registers the op)

    return torch.ops.edgeattn.ring_attend_fp8(q, q_s, k_cache, v_cache, k_scale, v_scale, positions, window, sinks,
                                              scale, splits)


__all__ = ["MARGIN", "attend", "layer_scales", "load", "quantize", "roundtrip", "store"]
