"""The FP8 E4M3 KV cache of the cuda target: per (layer, kv head) scales fixed at calibration.

A cached row holds k / k_scale and v / v_scale in float8_e4m3fn, half the bytes of bf16, so a long-context
decode step (which reads the cache, not the weights) reads half as much. The scales are fixed, not running:
a running amax would change the scale under rows already written. They are measured once, at build (or when
a bf16 bundle is opened with an FP8 cache), from a few prompts run through the decoder: scale = amax * MARGIN
/ 448 per layer and kv head, the margin leaving room for rows larger than the calibration saw (a larger one
saturates at +-448 * scale rather than overflowing).

    scales = calibrate(weights, prompts)        # [layers, 2, H_kv] fp32: keys [:, 0], values [:, 1]
    weights.t["kv_scale"] = scales              # the decode step and prefill then read and write FP8 rows

Everything that writes the cache goes through `store` (decode step, prefill) and everything that reads it
through the FP8 ring kernel (plugins/kernels/ring_fp8.py) or `load`.
"""

from __future__ import annotations

from edgeattn.errors import BuildError
from edgeattn.optional import require

torch = require("torch", "the FP8 KV cache")

E4M3_MAX = 448.0
MARGIN = 2.0  # headroom over the calibration's amax
CALIBRATION_TOKENS = 512  # per prompt, at most


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


def calibrate(weights, prompts, *, margin: float = MARGIN):
    """Per-layer, per-kv-head scales [layers, 2, H_kv] fp32 from the rows the prompts (lists of token ids)
    write into a cache in the weights' float type."""
    from edgeattn.runtime.cuda.prefill import prefill_logits

    s = weights.shape
    if "kv_scale" in weights.t:
        raise BuildError("fp8 cache calibration: expected weights with a float cache, found an FP8 one already")
    amax = torch.zeros(s.layers, 2, s.kv_heads, dtype=torch.float32, device=weights.device)
    for ids in prompts:
        ids = list(ids)[:min(CALIBRATION_TOKENS, s.window_max)]
        if not ids:
            continue
        keys, values = weights.new_cache(1)
        with torch.no_grad():
            prefill_logits(weights, torch.tensor(ids, device=weights.device), 0, 0, keys, values, 0)
        n = min(len(ids), s.capacity)
        for i in range(s.layers):
            for j, cache in enumerate((keys[i], values[i])):
                amax[i, j] = torch.maximum(amax[i, j], cache[0, :, :n].float().abs().amax(dim=(-1, -2)))
    scales = amax * margin / E4M3_MAX
    bad = ~torch.isfinite(scales) | (scales <= 0)
    if bool(bad.any()):
        layer, which, head = (int(v) for v in bad.nonzero()[0])
        raise BuildError(f"fp8 cache calibration: expected a finite, nonzero amax for every layer and kv head, "
                         f"found {float(amax[layer, which, head])} for the {('keys', 'values')[which]} of layer "
                         f"{layer}, kv head {head} (no prompt, or a layer that writes zeros); nothing written")
    return scales


__all__ = ["MARGIN", "attend", "calibrate", "layer_scales", "load", "quantize", "roundtrip", "store"]
