"""Which compute layers of an ONNX graph are quantized and which stay in float."""

from __future__ import annotations

from collections import Counter

import onnx

# integer GEMMs: ONNX's, and ONNX Runtime's (com.microsoft) that the cpu build lowers Q/DQ MatMuls to
_INT8_GEMMS = {"MatMulInteger", "QLinearMatMul", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm",
               "ConvInteger"}
_COMPUTE = {"MatMul", "Gemm", "Conv", "MatMulNBits"} | _INT8_GEMMS
# ONNX Runtime's fused attention kernels (the cpu build's), in layers of each precision: the scores and the
# weighted sum are float GEMMs; Attention holds the float q/k/v projections too, QAttention the int8 ones
_ATTENTION_GEMMS = {"Attention": {"float": 5}, "QAttention": {"float": 2, "int8": 3},
                    "MultiHeadAttention": {"float": 2}}
_INT_TYPES = {onnx.TensorProto.INT8: "int8", onnx.TensorProto.UINT8: "int8", onnx.TensorProto.INT4: "int4",
              onnx.TensorProto.UINT4: "int4", onnx.TensorProto.FLOAT8E4M3FN: "fp8"}


def _dequantized_types(graph: onnx.GraphProto) -> dict[str, str]:
    """Output name of each DequantizeLinear -> the quantized type it reads (int8, int4, fp8)."""
    types = {t.name: t.data_type for t in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    found: dict[str, str] = {}
    for node in graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        src = node.input[0]
        kind = _INT_TYPES.get(types.get(src, -1))
        if kind is None and src in producers and producers[src].op_type == "QuantizeLinear":
            q = producers[src]
            zp_type = types.get(q.input[2]) if len(q.input) > 2 and q.input[2] else None
            attr = {a.name: a.i for a in q.attribute}
            kind = _INT_TYPES.get(zp_type or attr.get("output_dtype", onnx.TensorProto.UINT8), "int8")
        if kind:
            found[node.output[0]] = kind
    return found


def summarize(model: onnx.ModelProto) -> dict:
    """Count compute layers by precision; name the ones left in float."""
    graph = model.graph
    dq = _dequantized_types(graph)
    counts: Counter[str] = Counter()
    float_layers: list[str] = []
    splits = {n.input[0]: len(n.output) for n in graph.node if n.op_type == "Split" and n.input}
    for node in graph.node:
        if node.domain == "com.microsoft" and node.op_type in _ATTENTION_GEMMS:
            counts.update(_ATTENTION_GEMMS[node.op_type])
            float_layers.append(node.name or node.op_type)
        if node.op_type not in _COMPUTE:
            continue
        if node.op_type in _INT8_GEMMS:  # one GEMM split into n outputs: n layers packed by the cpu build
            counts["int8"] += splits.get(node.output[0], 1) if node.op_type == "MatMulIntegerToFloat" else 1
            continue
        if node.op_type == "MatMulNBits":
            counts["int4"] += 1
            continue
        weight_kinds = [dq[i] for i in node.input[:2] if i in dq]
        if weight_kinds:
            counts["/".join(sorted(set(weight_kinds)))] += 1
        else:
            counts["float"] += 1
            float_layers.append(node.name or f"{node.op_type}#{len(float_layers)}")
    qdq = sum(1 for n in graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear"))
    return {"compute_layers": dict(counts), "float_layers": float_layers, "qdq_nodes": qdq}
