"""Fuse rotary position embeddings into ONNX Runtime's com.microsoft.RotaryEmbedding for the cpu target.

    x * unsqueeze(cos, 1) + concat(-x2, x1) * unsqueeze(sin, 1)      x1, x2 = split(x, 2, axis=-1)
    with cos = Cos(concat(f, f)), sin = Sin(concat(f, f)), f [B, S, D/2] the angles of each position
      -> RotaryEmbedding(x [B, H, S, D], position_ids, cos_cache, sin_cache, interleaved=0)

Positions in a stream are unbounded (a ring cache runs past the model's trained positions), so instead of a
table indexed by position the caches hold this step's own angles: cos_cache = Cos(f) seen as [B*S, D/2] and
position_ids = [[0 .. S-1], [S .. 2S-1], ...]: exact for any position, built once per angle tensor and shared
by every layer. One node replaces six per rotation (three rotations per layer in a cached decoder: the
query at t, the query for the sink rows, the key). TensorRT targets are left alone.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common

from edgeattn.passes import PassContext, PassResult
from edgeattn.passes.rewiring import anchored, constant, replace_value

MS = "com.microsoft"


def _const_ints(value: ir.Value | None) -> list[int] | None:
    tensor = ir.convenience.get_const_tensor(value) if value is not None else None
    return None if tensor is None else [int(a) for a in tensor.numpy().reshape(-1)]


def _last_axis(axis: int, value: ir.Value) -> bool:
    return axis == -1 or (value.shape is not None and axis == len(value.shape) - 1)


def _unsqueezed_1(value: ir.Value) -> ir.Value | None:
    """t where value = Unsqueeze(t, [1])."""
    node = value.producer()
    if node is None or node.op_type != "Unsqueeze" or _const_ints(node.inputs[1]) != [1]:
        return None
    return node.inputs[0]


def _angles(cos: ir.Value, sin: ir.Value) -> ir.Value | str:
    """f where cos = Cos(Concat(f, f)) and sin = Sin(the same Concat)."""
    c, s = cos.producer(), sin.producer()
    if c is None or s is None or c.op_type != "Cos" or s.op_type != "Sin":
        return "cos / sin are not Cos / Sin of the angles"
    if c.inputs[0] is not s.inputs[0]:
        return "cos and sin are not of the same angles"
    cat = c.inputs[0].producer()
    if cat is None or cat.op_type != "Concat" or len(cat.inputs) != 2 or cat.inputs[0] is not cat.inputs[1] \
            or not _last_axis(cat.attributes.get_int("axis", 0), cat.outputs[0]):
        return "the angles are not concat(f, f) on the last axis (half-rotation RoPE)"
    f = cat.inputs[0]
    if f.shape is None or len(f.shape) != 3 or f.dtype != ir.DataType.FLOAT:
        return "the angles are not a float32 [B, S, D/2] tensor"
    return f


def _term(add: ir.Node, x: ir.Value, rotated: ir.Value) -> tuple[ir.Value, ir.Value] | str:
    """(cos, sin) where add = x * unsqueeze(cos, 1) + rotated * unsqueeze(sin, 1)."""
    muls = [v.producer() for v in add.inputs[:2]]
    if any(m is None or m.op_type != "Mul" for m in muls):
        return "not a sum of two products"
    by_x = [m for m in muls if x in m.inputs[:2]]
    by_r = [m for m in muls if rotated in m.inputs[:2]]
    if len(by_x) != 1 or len(by_r) != 1 or by_x[0] is by_r[0]:
        return "not x * cos + rotate_half(x) * sin"
    cos = _unsqueezed_1(next(v for v in by_x[0].inputs[:2] if v is not x))
    sin = _unsqueezed_1(next(v for v in by_r[0].inputs[:2] if v is not rotated))
    if cos is None or sin is None:
        return "cos / sin are not unsqueezed at axis 1 (a [B, H, S, D] x)"
    return cos, sin


def match(neg: ir.Node) -> tuple[ir.Value, list[tuple[ir.Node, ir.Value]]] | str:
    """(x, [(the Add whose output is a rotation of x, its angles f)]) or why this Neg is not RoPE's."""
    split = neg.inputs[0].producer()
    if split is None or split.op_type != "Split" or len(split.outputs) != 2 or neg.inputs[0] is not split.outputs[1]:
        return "Neg does not read the second half of a Split"
    x = split.inputs[0]
    if not _last_axis(split.attributes.get_int("axis", 0), x) or (len(split.inputs) > 1 and split.inputs[1] is not None):
        return "the Split is not two equal halves of the last axis"
    if x.shape is None or len(x.shape) != 4 or not isinstance(x.shape[3], int) or x.dtype != ir.DataType.FLOAT:
        return "x is not a float32 [B, H, S, D] tensor with a static D"
    cats = [u.node for u in neg.outputs[0].uses()]
    if len(cats) != 1 or cats[0].op_type != "Concat" or list(cats[0].inputs) != [neg.outputs[0], split.outputs[0]] \
            or not _last_axis(cats[0].attributes.get_int("axis", 0), cats[0].outputs[0]):
        return "Neg is not followed by concat(-x2, x1)"
    rotated = cats[0].outputs[0]
    found = []
    for use in rotated.uses():
        mul = use.node
        adds = [u.node for u in mul.outputs[0].uses()] if mul.op_type == "Mul" else []
        if len(adds) != 1 or adds[0].op_type != "Add":
            return "rotate_half(x) is not used as rotate_half(x) * sin + x * cos"
        term = _term(adds[0], x, rotated)
        if isinstance(term, str):
            return term
        f = _angles(*term)
        if isinstance(f, str):
            return f
        found.append((adds[0], f))
    return (x, found) if found else "rotate_half(x) is unused"


class FuseRotaryForCpu:
    name = "fuse-rotary-cpu"

    def __call__(self, model: ir.Model, ctx: PassContext) -> PassResult:
        common.ShapeInferencePass()(model)
        graph = model.graph
        tables: dict[int, tuple[ir.Value, ir.Value, ir.Value]] = {}
        fused, unfused = 0, []
        for _, (x, rotations) in anchored(graph, "Neg", match, unfused, ignore="Neg does not read"):
            for add, f in rotations:
                if id(f) not in tables:
                    tables[id(f)] = _tables(graph, f)
                pid, cos_cache, sin_cache = tables[id(f)]
                node = ir.node("RotaryEmbedding", [x, pid, cos_cache, sin_cache], attributes={"interleaved": 0},
                               domain=MS, name=f"{add.name}/RotaryEmbedding")
                graph.insert_before(add, node)
                out = node.outputs[0]
                out.shape, out.dtype = add.outputs[0].shape, add.outputs[0].dtype
                replace_value(graph, add.outputs[0], out)
                fused += 1
        if fused:
            common.RemoveUnusedNodesPass()(model)
            model.opset_imports.setdefault(MS, 1)
        problems = [f"RoPE at {u['node']} left as element-wise ops: {u['reason']}" for u in unfused]
        return PassResult(self.name, fused > 0, f"{fused} rotations fused into RotaryEmbedding ({len(tables)} angle "
                          f"tables)", {"fused": fused, "tables": len(tables), "unfused": unfused}, problems)


def _tables(graph: ir.Graph, f: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    """(position_ids [B, S] = row-major indices, cos_cache and sin_cache [B*S, D/2]) from the angles f."""
    half = f.shape[2]
    nodes: list[ir.Node] = []

    def op(op_type, *inputs, **attrs):
        n = ir.node(op_type, list(inputs), attributes=attrs, name=f"rotary_tables_{f.name}/{op_type}{len(nodes)}")
        nodes.append(n)
        return n.outputs[0]

    rows = constant(graph, f"edgeattn_rotary_rows_{half}", np.array([-1, half], np.int64))
    shape_bs = op("Shape", f, start=0, end=2)  # [B, S]
    count = op("ReduceProd", shape_bs, keepdims=0)
    pid = op("Reshape", op("Range", constant(graph, "edgeattn_rotary_i0", np.array(0, np.int64)), count,
                           constant(graph, "edgeattn_rotary_i1", np.array(1, np.int64))), shape_bs)
    cos_cache, sin_cache = op("Reshape", op("Cos", f), rows), op("Reshape", op("Sin", f), rows)
    # insert where f is available: right after its producer (or first, for a graph input)
    anchor = f.producer()
    if anchor is None:
        graph.insert_before(next(iter(graph)), nodes)
    else:
        graph.insert_after(anchor, nodes)
    return pid, cos_cache, sin_cache


def table_angles(node: ir.Node) -> ir.Value | None:
    """f when `node` is a RotaryEmbedding this pass wrote: cos_cache = Reshape(Cos(f)), sin_cache = Reshape(Sin(f)),
    position_ids = Reshape(Range(0, B*S, 1), [B, S]) (row b*S + s of the tables for query row s of stream b)."""
    if node.op_type != "RotaryEmbedding" or node.domain != MS or len(node.inputs) != 4:
        return None
    reshape = node.inputs[1].producer() if node.inputs[1] is not None else None
    rng = reshape.inputs[0].producer() if reshape is not None and reshape.op_type == "Reshape" else None
    if rng is None or rng.op_type != "Range" or _const_ints(rng.inputs[0]) != [0] or _const_ints(rng.inputs[2]) != [1]:
        return None
    found = []
    for cache, trig in ((node.inputs[2], "Cos"), (node.inputs[3], "Sin")):
        reshape = cache.producer() if cache is not None else None
        inner = reshape.inputs[0].producer() if reshape is not None and reshape.op_type == "Reshape" else None
        if inner is None or inner.op_type != trig:
            return None
        found.append(inner.inputs[0])
    return found[0] if found[0] is found[1] else None
