"""What a cuda build (edgeattn.bundle.cuda_build) and the opening of a cuda bundle (bundle.py) do for FP8:
`--precision fp8` (FP8 weights, fp8.py) and `--kv-cache fp8` (the FP8 KV cache, fp8_cache.py).

Build: the KV cache's scales are calibrated on the bf16 weights from CALIBRATION_TEXT (a few paragraphs kept
here, so a bundle opened with an FP8 cache on a device gets the same scales without a corpus), then the
per-layer matrices are quantized; the manifest's `precision` section records, per matrix, "fp8" or "bf16" for
each token count of the choice table, and the table's origin. Every failure (a scale that is not finite or is
zero) is a BuildError before anything is written.
"""

from __future__ import annotations

from edgeattn.errors import BuildError
from edgeattn.optional import require
from edgeattn.runtime.cuda import fp8, fp8_cache
from edgeattn.runtime.cuda.prefill import prefill_logits

torch = require("torch", "FP8 on the cuda target")
CALIBRATION_TOKENS = 512  # per prompt, at most

CALIBRATION_TEXT = (
    "The city council met on Tuesday evening to discuss the new budget. After three hours of debate, members "
    "agreed to fund repairs to the northern bridge, which has been closed to heavy traffic since the spring "
    "floods, and to hire twelve more teachers for the schools in the eastern districts.",
    "def moving_average(values, window):\n    total = sum(values[:window])\n    out = [total / window]\n"
    "    for i in range(window, len(values)):\n        total += values[i] - values[i - window]\n"
    "        out.append(total / window)\n    return out\n",
    "Q: Why does the phone get warm when it charges? A: Charging moves energy into the battery, and no "
    "conversion is perfect: a part of it becomes heat in the charger circuit and in the cell itself. Fast "
    "charging moves more energy each second, so more heat is made, and the phone slows the charge when it "
    "gets too hot.",
    "In 1969 the first crewed landing on the Moon was watched by about 600 million people. The lander, "
    "Eagle, touched down with less than a minute of fuel to spare; the crew spent two and a half hours "
    "outside, collected 21.5 kilograms of rock and soil, and returned to Earth eight days after launch.",
)


def calibration_prompts(encode) -> list[list[int]]:
    """CALIBRATION_TEXT as token ids (`encode`: text -> ids)."""
    return [list(encode(text)) for text in CALIBRATION_TEXT]


def calibrate(weights, prompts, *, margin: float = fp8_cache.MARGIN):
    """Per-layer, per-kv-head scales [layers, 2, H_kv] fp32 from the rows the prompts (lists of token ids)
    write into a cache in the weights' float type."""
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
    scales = amax * margin / fp8_cache.E4M3_MAX
    bad = ~torch.isfinite(scales) | (scales <= 0)
    if bool(bad.any()):
        layer, which, head = (int(v) for v in bad.nonzero()[0])
        raise BuildError(f"fp8 cache calibration: expected a finite, nonzero amax for every layer and kv head, "
                         f"found {float(amax[layer, which, head])} for the {('keys', 'values')[which]} of layer "
                         f"{layer}, kv head {head} (no prompt, or a layer that writes zeros); nothing written")
    return scales


ROUNDINGS = ("gptq", "nearest")  # how FP8 weights are rounded: with error feedback (fp8_gptq.py), or to nearest
WEIGHT_CALIBRATION_DOCS = 16  # documents of the calibration text read for the weights' Hessians (~4,000 tokens)


def weight_calibration_texts(path=None) -> tuple[list[str], str]:
    """(documents, what they are) for the FP8 weights' error feedback: a text file, one document a line, or the
    first documents of the lee_background corpus (the toolkit's default calibration text; `edgeattn[models]`)."""
    from edgeattn import text

    docs = text.read_texts(path)[:WEIGHT_CALIBRATION_DOCS]
    return docs, (f"{path}" if path is not None else "lee_background") + f", first {len(docs)} documents"


def fp8_tensors(packed, tensors: dict, *, weights: bool, cache: bool, encode, rounding: str = "gptq",
                texts: list[str] | None = None, progress=None) -> tuple[dict, dict]:
    """A packed state dict with the FP8 parts: `kv_scale` (cache) calibrated on the float weights first, then
    the per-layer matrices in FP8 (weights), rounded with error feedback from `texts` (rounding "gptq") or to
    nearest. Sets the packed decoder's cache scales (its cache size follows). -> (tensors, what the rounding did:
    the manifest's `fp8.rounding`)."""
    if rounding not in ROUNDINGS:
        raise BuildError(f"fp8 rounding: expected one of {', '.join(ROUNDINGS)}, found {rounding!r}")
    out, record = dict(tensors), {}
    hessians = None
    if weights and rounding == "gptq":  # the bf16 decoder's own inputs, before the cache turns FP8
        from edgeattn.runtime.cuda.fp8_gptq import input_hessians

        hessians, tokens = input_hessians(packed, [encode(t) for t in (texts or [])])
        record = {"method": "gptq", "calibration_tokens": tokens}
    if cache:
        out["kv_scale"] = calibrate(packed, calibration_prompts(encode))
        packed.t["kv_scale"] = out["kv_scale"]
    if weights:
        from edgeattn.runtime.cuda.fp8_gptq import rounder

        out = fp8.quantize_state_dict(out, packed.shape.layers, rounder(hessians) if hessians else None, progress)
        if hessians is None:
            record = {"method": "nearest"}
        else:  # the products' output error on the calibration inputs, both roundings (inspect shows it)
            from edgeattn.runtime.cuda.fp8_gptq import output_error

            errors = {"nearest": [], "gptq": []}
            for key, h in hessians.items():
                errors["gptq"].append(output_error(tensors[key], out[key], out[f"{key}.scale"], h))
                errors["nearest"].append(output_error(tensors[key], *fp8.quantize_weight(tensors[key], key), h))
            record["output_error"] = {k: float(sum(v) / len(v)) for k, v in errors.items()}
    return out, record


def precision_section(precision: dict, shape, *, weights: bool, cache: bool, rounding: dict | None = None) -> dict:
    """The manifest's `precision` with the FP8 parts: attention runs in bf16, the KV cache's type, and with FP8
    weights the per-matrix plan and the table it came from (fp8.precision_plan)."""
    layers = dict(precision.get("layers", {}))
    layers["kv_cache"] = "fp8" if cache else layers.get("kv_cache", precision["float"])
    if weights:
        layers["attention"] = "bf16"
    out = {**precision, "layers": layers, "kv_cache": layers["kv_cache"]}
    if weights:
        out["fp8"] = {**fp8.precision_plan(shape), "rounding": rounding or {"method": "nearest"}}
    return out


def report_lines(precision: dict) -> list[str]:
    """report.md lines (what `edgeattn inspect` shows) for the FP8 parts."""
    lines = []
    plan = precision.get("fp8")
    if plan:
        t = plan["table"]
        lines.append(f"- fp8 weights (E4M3, per-row scales; activations per token): per matrix, the token counts "
                     f"that run in FP8 (the others in bf16 on the same FP8-rounded weights), from the table measured "
                     f"on {t['device']} ({t['measured']}; FP8 where >= {t['min_gain']}x bf16):")
        for name, m in plan["matrices"].items():
            chosen = m["by_tokens"]
            if isinstance(chosen, str):
                lines.append(f"  - {name} [{m['k']} x {m['n']}]: {chosen}")
                continue
            fp8_at = [k for k, v in chosen.items() if v == "fp8"]
            lines.append(f"  - {name} [{m['k']} x {m['n']}]: " + (f"fp8 from {fp8_at[0]} tokens ({', '.join(fp8_at)})"
                         if fp8_at else "bf16 at every token count (FP8 does not pay at this size)"))
        r = plan.get("rounding", {"method": "nearest"})
        if r["method"] == "gptq":
            e = r.get("output_error", {})
            lines.append(f"- fp8 rounding: with error feedback (GPTQ) from {r.get('calibration', 'calibration text')} "
                         f"({r['calibration_tokens']} tokens); mean relative output error "
                         f"{e.get('gptq', float('nan')):.2e} against {e.get('nearest', float('nan')):.2e} to nearest")
        else:
            lines.append("- fp8 rounding: to nearest")
    if precision.get("kv_cache") == "fp8":
        lines.append(f"- KV cache: fp8 (E4M3, one scale per layer and kv head, calibrated with a margin of "
                     f"{fp8_cache.MARGIN:g}x over the amax)")
    return lines


def open_fp8(tensors: dict, manifest_precision: dict, *, kv_cache: str | None, encode, build) -> dict:
    """Tensors read from a bundle -> the decode step's: FP8 weights as tuples, and an FP8 cache's scales
    (calibrated now, `build(tensors)` -> a PackedDecoder, when `kv_cache == "fp8"` and the bundle has none).
    The GPU's FP8 support is checked before (bundle.py)."""
    out = fp8.fp8_weights(tensors) if any(k.endswith(".scale") for k in tensors) else dict(tensors)
    if kv_cache == "fp8" and "kv_scale" not in out:
        out["kv_scale"] = calibrate(build(out), calibration_prompts(encode))
    return out


__all__ = ["CALIBRATION_TEXT", "ROUNDINGS", "WEIGHT_CALIBRATION_DOCS", "calibrate", "calibration_prompts", "fp8_tensors", "open_fp8", "precision_section",
           "report_lines", "weight_calibration_texts"]
