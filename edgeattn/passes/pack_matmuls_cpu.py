"""Pack the projections that read one input into one MatMul for the cpu target (Q/K/V, gate/up).

    MatMul(x, W1), MatMul(x, W2), ...            (constant weights [K, N_i])
      -> Split(MatMul(x, concat(W1, W2, ..)), [N_1, N_2, ..], axis=-1)
    MatMulNBits(x, B_i, scales_i) of one K, block, bits and accuracy level, no zero points, no bias
      -> Split(MatMulNBits(x, concat(B_i), concat(scales_i), N = sum N_i), ...)

At one token a step each projection is a matrix-vector product: one wide product instead of three narrow
ones splits better over the threads and, for MatMulNBits with int8 activations (accuracy level 4), quantizes
the activations once instead of once per projection. The outputs are the same numbers (the same dot
products, column by column). TensorRT targets are left alone.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx_ir as ir

from edgeattn.passes import PassContext, PassResult
from edgeattn.passes.rewiring import constant, replace_value

MS = "com.microsoft"


def _const(value: ir.Value | None) -> np.ndarray | None:
    tensor = ir.convenience.get_const_tensor(value) if value is not None else None
    return None if tensor is None else tensor.numpy()


def _plain_key(node: ir.Node) -> tuple | None:
    w = _const(node.inputs[1])
    if w is None or w.ndim != 2 or w.dtype != np.float32 or node.inputs[0].dtype != ir.DataType.FLOAT:
        return None
    return ("MatMul", w.shape[0])


def _nbits_key(node: ir.Node) -> tuple | None:
    extra = [v for v in node.inputs[3:] if v is not None]
    if extra or _const(node.inputs[1]) is None or _const(node.inputs[2]) is None:
        return None  # zero points, group index or bias: not packed
    a = node.attributes
    return ("MatMulNBits", a.get_int("K"), a.get_int("bits", 4), a.get_int("block_size"),
            a.get_int("accuracy_level", 0), str(node.inputs[0].dtype))


class PackMatMulsForCpu:
    name = "pack-matmuls-cpu"

    def __call__(self, model: ir.Model, ctx: PassContext) -> PassResult:
        graph = model.graph
        groups: dict[tuple, list[ir.Node]] = defaultdict(list)
        for node in graph:
            if node.op_type == "MatMul" and node.domain == "":
                key = _plain_key(node)
            elif node.op_type == "MatMulNBits" and node.domain == MS:
                key = _nbits_key(node)
            else:
                continue
            if key is not None:
                groups[(id(node.inputs[0]),) + key].append(node)
        packed, products = 0, 0
        for nodes in groups.values():
            if len(nodes) < 2:
                continue
            _pack(graph, nodes)
            packed += 1
            products += len(nodes)
        into_attention = _packed_into_attention(graph)
        return PassResult(self.name, packed > 0, f"{products} projections packed into {packed} wide ones"
                          + (f", {into_attention} read whole by GroupQueryAttention" if into_attention else ""),
                          {"packed": packed, "projections": products, "into_attention": into_attention})


def _packed_into_attention(graph: ir.Graph) -> int:
    """GroupQueryAttention(q, k, v) with q, k, v the Split of one packed product -> GroupQueryAttention(packed):
    the op reads the packed [B, S, (H + 2 H_kv) D] layout itself, so the Split's copies go."""
    done = 0
    for node in [n for n in graph if n.op_type == "GroupQueryAttention" and n.domain == MS]:
        split = node.inputs[0].producer() if node.inputs[0] is not None else None
        if split is None or split.op_type != "Split" or len(split.outputs) != 3 \
                or list(split.outputs) != list(node.inputs[:3]) or any(len(o.uses()) != 1 for o in split.outputs):
            continue
        shape = node.inputs[0].shape  # the query [B, S, H*D]: the Split is along its last axis
        if split.attributes.get_int("axis", 0) not in (-1, 2) or shape is None or len(shape) != 3:
            continue
        node.replace_input_with(0, split.inputs[0])
        node.replace_input_with(1, None)
        node.replace_input_with(2, None)
        graph.remove(split, safe=True)
        done += 1
    return done


def _pack(graph: ir.Graph, nodes: list[ir.Node]) -> None:
    first, x = nodes[0], nodes[0].inputs[0]
    name = f"{first.name}/packed{len(nodes)}"
    if first.op_type == "MatMul":
        weights = [_const(n.inputs[1]) for n in nodes]
        sizes = [w.shape[1] for w in weights]
        w = constant(graph, f"{name}/weight", np.concatenate(weights, axis=1))
        wide = ir.node("MatMul", [x, w], name=name)
    else:
        blobs = [_const(n.inputs[1]) for n in nodes]
        scales = [_const(n.inputs[2]) for n in nodes]
        sizes = [n.attributes.get_int("N") for n in nodes]
        blob = constant(graph, f"{name}/B", np.concatenate(blobs, axis=0))  # [N, blocks, bytes]: rows are columns
        scale = constant(graph, f"{name}/scales", np.concatenate(scales, axis=0))  # [N*blocks] or [N, blocks]
        attrs = {k: v for k, v in first.attributes.items()}
        attrs["N"] = ir.AttrInt64("N", sum(sizes))
        wide = ir.node("MatMulNBits", [x, blob, scale], attributes=attrs, domain=MS, name=name)
    split = ir.node("Split", [wide.outputs[0], constant(graph, f"{name}/sizes", np.array(sizes, np.int64))],
                    attributes={"axis": -1}, num_outputs=len(nodes), name=f"{name}/Split")
    # the wide product goes where the first projection was (x is ready there, and every reader comes later)
    graph.insert_before(first, [wide, split])
    wide.outputs[0].dtype = first.outputs[0].dtype
    for node, out in zip(nodes, split.outputs):
        out.shape, out.dtype = node.outputs[0].shape, node.outputs[0].dtype
        replace_value(graph, node.outputs[0], out)
        graph.remove(node, safe=True)
