"""Per-layer facts of a TensorRT engine: type, precision, source ONNX node.

Two sources give the same rows: the builder's detailed log (a build with
ProfilingVerbosity.DETAILED logs a "Layers:" block; no GPU needed) and the engine inspector's JSON
(needs a deserialized engine, hence a GPU).
"""

from __future__ import annotations

import re

# datatype spellings in logs and inspector JSON -> our precision names (order: most specific first)
_DTYPES = (("fp8", ("FP8", "Float8", "E4M3")), ("fp4", ("FP4", "E2M1")), ("int4", ("Int4", "INT4")),
           ("int8", ("Int8", "INT8")), ("bf16", ("BFloat16", "BF16")), ("fp16", ("Half", "FP16")),
           ("fp32", ("Float", "FP32")))
_QUANTIZED = ("int8", "int4", "fp8", "fp4")
_GLUE = ("kgen", "shape_call", "reshape", "cast", "shuffle", "slice", "concat")  # Myelin glue, not compute
_COMPUTE = ("gemm", "conv", "matrixmultiply", "matmul", "fullyconnected")
_LINE = re.compile(r"^Name: (?P<name>.*?), LayerType: (?P<type>.*?), Inputs: (?P<rest>.*)$")


def _precision(datatype: str) -> str | None:
    if datatype in dict(_DTYPES):
        return datatype
    for name, spellings in _DTYPES:
        if any(s in datatype for s in spellings):
            return name
    return None


def _precisions(text: str) -> list[str]:
    found = [_precision(m) for m in re.findall(r"Datatype: ([^,}]+)", text)]
    return sorted({p for p in found if p}, key=[n for n, _ in _DTYPES].index)


def _onnx_nodes(metadata: str) -> list[str]:
    """'[ONNX Layer: node_of_s | attn0 (WindowedAttention)][ONNX Layer: y]' -> ['node_of_s', 'y'];
    the call stack after '|' (a local function's caller) is kept as 'node (in attn0)'."""
    nodes = []
    for entry in re.findall(r"\[ONNX Layer: ([^\]]*)\]", metadata):
        parts = [p.strip() for p in entry.split("|")]
        nodes.append(parts[0] + (f" (in {parts[1]})" if len(parts) > 1 else ""))
    return nodes


def is_compute(layer_type: str) -> bool:
    lowered = layer_type.lower()
    return any(k in lowered for k in _COMPUTE)


def from_log(text: str) -> list[dict]:
    """Rows from the "Layers:" block of a detailed build log."""
    rows = []
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if not m:
            continue
        rest = m.group("rest")
        inputs, _, tail = rest.partition(", Outputs: ")
        inputs, _, constants = inputs.partition(", Constants: ")
        # constants: fp32 alpha/beta scalars in every GEMM, and quantized weights (int4 weight-only)
        inputs += " " + " ".join(f"Datatype: {p}," for p in _precisions(constants) if p in _QUANTIZED)
        outputs, _, tail = tail.partition(", TacticName: ")
        tactic, _, meta = tail.partition(", Metadata: ")
        rows.append(_row(m.group("name"), m.group("type"), inputs, outputs, tactic.split(",")[0], meta))
    return rows


def from_inspector(layers: list[dict]) -> list[dict]:
    """Rows from the engine inspector's JSON layers."""
    rows = []
    for layer in layers:
        def dtypes(key):
            return " ".join(f"Datatype: {t.get('Format/Datatype', t.get('Datatype', ''))}," for t in layer.get(key, []))

        rows.append(_row(str(layer.get("Name", "")), str(layer.get("LayerType", "")), dtypes("Inputs"),
                         dtypes("Outputs"), str(layer.get("TacticName", "")), str(layer.get("Metadata", ""))))
    return rows


def _row(name: str, layer_type: str, inputs: str, outputs: str, tactic: str, meta: str) -> dict:
    in_prec = _precisions(inputs)
    profile = re.search(r"_myl(\d+)_\d+$", name)  # Myelin names each profile's copy ..._myl<profile>_<i>
    return {"name": name, "type": layer_type, "profile": int(profile.group(1)) if profile else 0,
            "precision": "+".join(in_prec or _precisions(outputs)) or "-",
            "output_precision": "+".join(_precisions(outputs)) or "-",
            "onnx_nodes": _onnx_nodes(meta), "tactic": tactic.strip(), "compute": is_compute(layer_type)}


def mark_compute(rows: list[dict], compute_nodes: set[str]) -> None:
    """Also count as compute the fused layers (INT4 weight-only `runtime_fusion`) that carry a MatMul/Gemm/Conv."""
    for row in rows:
        touches = any(n.split(" (in ")[0] in compute_nodes for n in row["onnx_nodes"])
        row["compute"] = row["compute"] or (touches and row["type"].lower() not in _GLUE)


def summarize(rows: list[dict]) -> dict:
    """Compute layers of profile 0 counted by precision; the ones left in fp32."""
    rows = [r for r in rows if r.get("profile", 0) == 0]
    counts: dict[str, int] = {}
    for row in rows:
        if row["compute"]:
            counts[row["precision"]] = counts.get(row["precision"], 0) + 1
    left = [r["name"] for r in rows if r["compute"] and r["precision"] == "fp32"]
    return {"compute_layers": counts, "fp32_layers": left, "layers": len(rows)}
