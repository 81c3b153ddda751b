"""Lower INT8 Q/DQ MatMuls to ONNX Runtime's integer kernel for the cpu target.

    MatMul(DQ(Q(x, sx, 0)), DQ(W_int8, sw[N], 0, axis=1))
      -> MatMulIntegerToFloat(Q(x, sx, 128 as uint8), W_int8, sx, sw, 128)     (com.microsoft)

A symmetric int8 activation shifted by 128 is exactly the uint8 one with zero point 128, so the result is
the Q/DQ graph's, computed by ORT's u8s8 integer GEMM (what quantize_dynamic uses) instead of float
MatMul on dequantized tensors. A following Add of a constant [N] bias is folded into the node, and MatMuls
that quantize the same activation with the same scale share one QuantizeLinear and then one wider GEMM
(weights, scales and biases concatenated, then a Split: q/k/v become one GEMM). Applied to the cpu target only: the Q/DQ graph itself is what TensorRT
builds. INT4 block-wise DQ -> MatMul is left to ORT's own MatMulNBits fusion.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from edgeattn.passes import PassContext, PassResult
from edgeattn.passes.rewiring import constant, replace_value

MS = "com.microsoft"
FLOAT = "weight input is not DequantizeLinear"  # a float MatMul (attention scores): nothing to lower
BLOCKWISE = "block-wise weight"  # INT4: ORT fuses DQ -> MatMul into MatMulNBits itself


def _const(value: ir.Value | None) -> np.ndarray | None:
    if value is None or value.const_value is None:
        return None
    return value.const_value.numpy()


def _why_not(matmul: ir.Node) -> str | None:
    """None when the MatMul matches the int8 Q/DQ pattern, else the reason it does not."""
    a, b = (v.producer() if v is not None else None for v in matmul.inputs[:2])
    if b is None or b.op_type != "DequantizeLinear":
        return FLOAT
    if b.attributes.get("block_size") is not None:
        return BLOCKWISE
    w, sw, zw = _const(b.inputs[0]), _const(b.inputs[1]), _const(b.inputs[2] if len(b.inputs) > 2 else None)
    if w is None or w.dtype != np.int8 or w.ndim != 2:
        return "weight is not a 2-D int8 constant"
    if b.attributes.get_int("axis", 1) not in (1, -1):
        return "weight scales are not per output column (axis 1)"
    if sw is None or sw.size not in (1, w.shape[1]) or (zw is not None and np.any(zw != 0)):
        return "weight scale / zero point are not constant and symmetric"
    if a is None or a.op_type != "DequantizeLinear" or a.inputs[0].producer() is None \
            or a.inputs[0].producer().op_type != "QuantizeLinear":
        return "activation input is not QuantizeLinear -> DequantizeLinear"
    q = a.inputs[0].producer()
    sx, zx = _const(q.inputs[1]), _const(q.inputs[2] if len(q.inputs) > 2 else None)
    if sx is None or sx.size != 1 or zx is None or zx.dtype != np.int8 or np.any(zx != 0):
        return "activation is not per-tensor symmetric int8 with a constant scale"
    if _const(a.inputs[1]) is None or float(_const(a.inputs[1]).reshape(())) != float(sx.reshape(())):
        return "activation Q and DQ scales differ"
    return None


def int8_operands(matmul: ir.Node) -> tuple[ir.Value, np.ndarray, np.ndarray, np.ndarray] | str:
    """(x, its per-tensor scale, the int8 weight [K, N], its scales) of an int8 Q/DQ MatMul, or why it is not one."""
    reason = _why_not(matmul)
    if reason is not None:
        return reason
    dq_w, q = matmul.inputs[1].producer(), matmul.inputs[0].producer().inputs[0].producer()
    return q.inputs[0], _const(q.inputs[1]), _const(dq_w.inputs[0]), _const(dq_w.inputs[1])


def _bias_add(matmul: ir.Node, n_out: int) -> tuple[ir.Node, ir.Value] | None:
    """The Add that only adds a constant [N] float bias to the MatMul's output, and that bias."""
    uses = list(matmul.outputs[0].uses())
    if len(uses) != 1 or uses[0].node.op_type != "Add" or matmul.outputs[0] in matmul.graph.outputs:
        return None
    add = uses[0].node
    other = add.inputs[1 - uses[0].idx]
    bias = _const(other)
    if bias is None or bias.dtype != np.float32 or bias.shape != (n_out,):
        return None
    return add, other


def _lower(graph: ir.Graph, matmul: ir.Node, zero_u8: ir.Value, quantized: dict) -> bool:
    """Rewrite one MatMul; returns True when its bias Add was folded in. `quantized` reuses one uint8
    QuantizeLinear per (activation, scale)."""
    dq_w = matmul.inputs[1].producer()
    q = matmul.inputs[0].producer().inputs[0].producer()
    x, sx = q.inputs[0], q.inputs[1]
    key = (id(x), float(_const(sx).reshape(())))
    new_nodes = []
    if key not in quantized:
        quant = ir.node("QuantizeLinear", [x, sx, zero_u8], name=f"{matmul.name}/quantize_u8")
        quant.outputs[0].dtype = ir.DataType.UINT8
        quantized[key] = quant.outputs[0]
        new_nodes.append(quant)
    inputs = [quantized[key], dq_w.inputs[0], sx, dq_w.inputs[1], zero_u8]
    bias = _bias_add(matmul, _const(dq_w.inputs[0]).shape[1])
    if bias is not None:
        inputs += [None, bias[1]]  # no weight zero point (symmetric), then the bias
    fused = ir.node("MatMulIntegerToFloat", inputs, domain=MS, name=f"{matmul.name}/int8")
    fused.outputs[0].dtype = ir.DataType.FLOAT
    replaced = bias[0] if bias is not None else matmul  # the value downstream nodes read
    fused.outputs[0].shape = replaced.outputs[0].shape
    graph.insert_before(matmul, [*new_nodes, fused])
    replace_value(graph, replaced.outputs[0], fused.outputs[0])
    if bias is not None:
        graph.remove(bias[0], safe=True)
    graph.remove(matmul, safe=True)
    return bias is not None


def merge_siblings(graph: ir.Graph) -> int:
    """MatMulIntegerToFloat nodes reading one quantized activation (shared q/k/v quantizer) with constant
    weights, scales and biases become one wider GEMM and a Split: fewer, larger GEMMs. Returns nodes merged away."""
    groups: dict[int, list[ir.Node]] = {}
    for node in graph:
        if node.op_type == "MatMulIntegerToFloat" and node.domain == MS:
            groups.setdefault(id(node.inputs[0]), []).append(node)
    merged = 0
    for nodes in groups.values():
        if len(nodes) < 2:
            continue
        consts = [[_const(n.inputs[i]) if i < len(n.inputs) else None for i in (1, 3, 6)] for n in nodes]
        a_scales = {float(_const(n.inputs[2]).reshape(())) if _const(n.inputs[2]) is not None else None for n in nodes}
        if any(w is None or s is None or b is None or w.ndim != 2 for w, s, b in consts) or len(a_scales) != 1 \
                or None in a_scales or len({w.shape[0] for w, _, _ in consts}) != 1:
            continue
        sizes = [w.shape[1] for w, _, _ in consts]
        widths = [np.broadcast_to(s.reshape(-1), (w.shape[1],)) for w, s, _ in consts]
        base = nodes[0].name or "merged"
        weight = constant(graph, f"{base}/merged_weight", np.concatenate([w for w, _, _ in consts], axis=1))
        scale = constant(graph, f"{base}/merged_weight_scale", np.concatenate(widths).astype(np.float32))
        bias = constant(graph, f"{base}/merged_bias", np.concatenate([b for _, _, b in consts]).astype(np.float32))
        split_sizes = constant(graph, f"{base}/merged_split", np.array(sizes, np.int64))
        first = nodes[0]
        wide = ir.node("MatMulIntegerToFloat", [first.inputs[0], weight, first.inputs[2], scale, first.inputs[4], None, bias],
                       domain=MS, name=f"{base}/merged")
        wide.outputs[0].dtype = ir.DataType.FLOAT
        split = ir.node("Split", [wide.outputs[0], split_sizes], attributes={"axis": -1}, num_outputs=len(nodes),
                        name=f"{base}/split")
        graph.insert_before(first, [wide, split])
        for n, out in zip(nodes, split.outputs):
            out.dtype, out.shape = n.outputs[0].dtype, n.outputs[0].shape
            replace_value(graph, n.outputs[0], out)
            graph.remove(n, safe=True)
        merged += len(nodes) - 1
    return merged


class LowerQdqMatMulForCpu:
    name = "lower-qdq-cpu"

    def __call__(self, model: ir.Model, ctx: PassContext) -> PassResult:
        graph = model.graph
        lowered, biased, problems = 0, 0, []
        zero_u8, quantized = None, {}
        for node in list(graph):
            if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
                continue
            reason = _why_not(node)
            if reason is not None:
                if reason not in (FLOAT, BLOCKWISE):
                    problems.append(f"{node.name or 'MatMul'}: kept as Q/DQ float MatMul: {reason}")
                continue
            if zero_u8 is None:
                zero_u8 = ir.Value(name="qdq_cpu_zero_point_u8", const_value=ir.tensor(np.array(128, np.uint8), name="qdq_cpu_zero_point_u8"))
                zero_u8.shape, zero_u8.dtype = ir.Shape([]), ir.DataType.UINT8
                graph.register_initializer(zero_u8)
            biased += _lower(graph, node, zero_u8, quantized)
            lowered += 1
        merged = 0
        if lowered:
            model.opset_imports.setdefault(MS, 1)
            merged = merge_siblings(graph)
            import onnx_ir.passes.common as common

            common.RemoveUnusedNodesPass()(model)
        return PassResult(self.name, lowered > 0, f"{lowered} int8 Q/DQ MatMuls -> MatMulIntegerToFloat "
                          f"({biased} with the bias folded in, {len(quantized)} activation quantizations, "
                          f"{merged} merged into a sibling's GEMM)",
                          {"lowered": lowered, "bias_folded": biased, "activation_quantizations": len(quantized),
                           "merged": merged}, problems)
