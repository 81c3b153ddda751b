"""The FP8 E4M3 KV cache of the cuda target: per (layer, kv head) scales fixed at calibration.

A cached row holds k / k_scale and v / v_scale in float8_e4m3fn, half the bytes of bf16, so a long-context
decode step (which reads the cache, not the weights) reads half as much. The scales are fixed, not running:
a running amax would change the scale under rows already written. They are measured once, at build (or when
a bf16 bundle is opened with an FP8 cache), from a few prompts run through the decoder: scale = amax * MARGIN
/ 448 per layer and kv head, the margin leaving room for rows larger than the calibration saw (a larger one
saturates at +-448 * scale rather than overflowing).

    scales = fp8_build.calibrate(weights, prompts)   # [layers, 2, H_kv] fp32: keys [:, 0], values [:, 1]
    weights.t["kv_scale"] = scales                   # the decode step and prefill then read and write FP8 rows

The sink rows are the exception: every later token attends to them, often with most of its weight, so a
rounding error in a sink key moves every score. An FP8 cache keeps them twice: in its FP8 rows (as any row) and
in a small buffer of the weights' float type per layer (`Layers.sinks`: [streams, H_kv, sinks + 1, D], x / scale
with the same scale, so the kernel's scale arithmetic is the same; row `sinks` takes the writes of later rows, so
the write is one scatter with no branch inside a CUDA graph). Attention reads the sink rows from that buffer. On
SmolLM2-135M this took the FP8 cache's perplexity cost from +1.0% to the figure docs/fp8.md gives.

Everything that writes the cache goes through `store` (decode step, prefill) and everything that reads it
through the FP8 ring kernel (plugins/kernels/ring_fp8.py) or `load`.
"""

from __future__ import annotations

from edgeattn.optional import require

torch = require("torch", "the FP8 KV cache")

E4M3_MAX = 448.0
MARGIN = 2.0  # headroom over the calibration's amax (fp8_build.calibrate)


class Layers(list):
    """A cache's per-layer buffers (keys or values), with `sinks`: an FP8 cache's float sink buffers, one per
    layer, or None (a float cache keeps its sinks in its own rows)."""

    sinks: list | None = None

    @classmethod
    def of(cls, layers, sinks=None) -> "Layers":
        out = cls(layers)
        out.sinks = sinks
        return out


def sink_buffers(keys, values, i: int):
    """(key sinks, value sinks) [streams, H_kv, sinks + 1, D] of layer i, or (None, None)."""
    ks, vs = getattr(keys, "sinks", None), getattr(values, "sinks", None)
    return (None, None) if ks is None or vs is None else (ks[i], vs[i])


def quantize(x, scale):
    """x [..., H_kv, D] -> float8_e4m3fn x / scale (scale [H_kv]), saturating at +-448."""
    return (x.float() / scale.float()[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def load(x8, scale, dtype, sinks=None):
    """FP8 rows [..., H_kv, L, D] (H_kv third from the end) -> `dtype`. With `sinks` (the rows' sink buffer,
    [..., H_kv, S + 1, D]) the slice starts at row 0 and its first rows (up to S) come from the buffer."""
    out = (x8.float() * scale.float()[:, None, None]).to(dtype)
    if sinks is not None:
        n = min(sinks.shape[-2] - 1, out.shape[-2])
        out[..., :n, :] = (sinks[..., :n, :].float() * scale.float()[:, None, None]).to(dtype)
    return out


def roundtrip(x, scale, sink=None):
    """x [..., H_kv, D] as the cache will give it back; `sink` ([...] bool): rows kept in the sink buffer."""
    back = (quantize(x, scale).float() * scale.float()[:, None]).to(x.dtype)
    if sink is None:
        return back
    kept = ((x.float() / scale.float()[:, None]).to(x.dtype).float() * scale.float()[:, None]).to(x.dtype)
    return torch.where(sink[..., None, None], kept, back)


def store(cache, streams, rows, x, scale, sinks=None) -> None:
    """cache[streams, :, rows] = x [n, H_kv, D], quantized when `scale` [H_kv] is given (an FP8 cache); rows
    below S also into `sinks` [B, H_kv, S + 1, D] as x / scale (the others into its spare row S)."""
    cache[streams, :, rows] = x.to(cache.dtype) if scale is None else quantize(x, scale)
    if sinks is not None:
        spare = sinks.shape[2] - 1
        sinks[streams, :, rows.clamp(max=spare)] = (x.float() / scale.float()[:, None]).to(sinks.dtype)


def layer_scales(weights, i: int):
    """(k_scale, v_scale) [H_kv] of layer i, or (None, None) for a cache in the weights' float type."""
    kv = weights.t.get("kv_scale")
    return (None, None) if kv is None else (kv[i, 0], kv[i, 1])


def attend(q, q_s, k_cache, v_cache, k_scale, v_scale, positions, window, sinks: int, scale: float, splits: int,
           k_sinks=None, v_sinks=None):
    """The ring attention over rows already written: ring_ops.ring_attend, or its FP8 form (sink rows from
    `k_sinks` / `v_sinks` when given)."""
    if k_scale is None:
        import edgeattn.plugins.kernels.ring_ops  # noqa: F401  (registers the op)

        return torch.ops.edgeattn.ring_attend(q, q_s, k_cache, v_cache, positions, window, sinks, scale, splits)
    import edgeattn.plugins.kernels.ring_fp8  # noqa: F401  (registers the op)

    return torch.ops.edgeattn.ring_attend_fp8(q, q_s, k_cache, v_cache, k_scale, v_scale, positions, window, sinks,
                                              scale, splits, k_sinks, v_sinks)


__all__ = ["MARGIN", "Layers", "attend", "layer_scales", "load", "quantize", "roundtrip", "sink_buffers", "store"]
