"""The human-readable build report (report.md), rendered from the manifest alone."""

from __future__ import annotations

from edgeattn.bundle.manifest import Manifest


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def render(m: Manifest) -> str:
    s = m.sections
    lines = [f"# edgeattn build report: {m.name}", "",
             f"- target: **{m.target['name']}** ({m.source.get('target_reason', '')}); backend {m.backend}",
             f"- artifact: `{m.artifact}`; source opset {m.source.get('opset')}",
             f"- built {m.created} with " + ", ".join(f"{k} {v}" for k, v in m.toolchain.items()), ""]
    lines += ["## Inputs and outputs", ""]
    lines += _table(["name", "role", "dtype", "dims"],
                    [[t.name, t.role, t.dtype, "x".join(map(str, t.dims))] for t in m.inputs]
                    + [[t.name, "output", t.dtype, "x".join(map(str, t.dims))] for t in m.outputs])
    if m.shape_ranges:
        lines += ["", "Shape ranges (min / opt / max): " + ", ".join(
            f"{k} {v[0]}/{v[1]}/{v[2]}" for k, v in m.shape_ranges.items())]
    lines += ["", "## Graph passes", ""]
    lines += _table(["pass", "changed", "summary"],
                    [[p["name"], "yes" if p["changed"] else "no", p["summary"]] for p in s.get("passes", [])])
    for key, section in s.items():
        if key in ("passes", "engine", "parity", "problems", "dimension_kinds") or not isinstance(section, dict):
            continue
        summary = section.get("summary")
        if summary:
            lines += ["", f"## {key}", "", str(summary)]
    lines += ["", "## Precision", ""]
    layers = m.precision.get("compute_layers", {})
    lines.append(f"Float type {m.precision.get('float')}; compute layers: "
                 + (", ".join(f"{v} {k}" for k, v in layers.items()) or "none"))
    floats = m.precision.get("float_layers", [])
    if floats and any(k != "float" for k in layers):
        lines.append(f"Left in float ({len(floats)}): " + ", ".join(floats[:20]) + (" ..." if len(floats) > 20 else ""))
    lines += _engine_layers(s.get("engine", {}))
    parity = s.get("parity", {})
    lines += ["", "## Parity with the source model", ""]
    if parity.get("status") == "skipped":
        lines.append(f"Skipped: {parity.get('reason')}")
    elif parity:
        relative = parity.get("relative_diff")
        lines.append(f"{parity['status']}: " + (f"relative diff {relative:.3g} (max abs diff {parity['max_abs_diff']:.3g} "
                     f"of outputs up to {parity['reference_max_abs']:.3g})" if relative is not None else
                     f"max abs diff {parity['max_abs_diff']:.3g}")
                     + f", tolerance {parity['tolerance']:.3g} ({parity.get('tolerance_basis', '')}) at sizes "
                     f"{parity.get('sizes')}" + (f"; greedy (argmax) agreement {parity['greedy_agreement']:.0%}"
                                                 if "greedy_agreement" in parity else ""))
    problems = s.get("problems", [])
    lines += ["", "## Problems", ""]
    lines += [f"- {p}" for p in problems] or ["None."]
    return "\n".join(lines) + "\n"


def _engine_layers(engine: dict) -> list[str]:
    """The per-layer section of a TensorRT engine: type, precision, source ONNX node; attention mapping."""
    rows = [r for r in engine.get("layers", []) if r.get("profile", 0) == 0 and r.get("type") != "shape_call"]
    if not rows:
        return []
    lines = ["", "## Engine layers", "",
             f"{engine.get('library')} {engine.get('version')}; from the {engine.get('layer_source')}; "
             f"{len(engine.get('profiles', []))} optimization profile(s), layers of profile 0 shown."]
    applied = engine.get("applied", {})
    if applied.get("compute_capabilities"):
        lines.append("Compute capabilities: " + ", ".join(applied["compute_capabilities"])
                     + "".join(f"; dropped SM{d['sm']} ({d['reason']})" for d in engine.get("dropped_compute_capabilities", [])))
    lines += [""] + _table(["layer", "type", "precision", "compute", "ONNX node(s)"],
                           [[r["name"], r["type"], r["precision"], "yes" if r["compute"] else "",
                             ", ".join(r["onnx_nodes"]) or "-"] for r in rows])
    floats = [r["name"] for r in rows if r["compute"] and r["precision"] == "fp32"]
    lines += ["", "Compute layers left in fp32: " + (", ".join(floats) if floats else "none")]
    attention = engine.get("attention", [])
    if attention:
        lines.append("Attention: " + "; ".join(
            f"{a['node']} -> {a['to']}" + (f" ({a['reason']})" if a.get("reason") else "") for a in attention))
    return lines
