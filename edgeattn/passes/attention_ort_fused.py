"""WindowedAttention -> ONNX Runtime's fused attention kernels, for the cpu target's dense lowering.

A layer whose q, k and v are head splits (Transpose 0 2 1 3 of a Reshape) of [B, S, H*D] projections and
whose output is merged back to [B, S, H*D] runs as one com.microsoft node instead of about twelve plain ops:

    q, k, v = Add(MatMul(x, W?), b?), one float x            -> Attention(x, [Wq Wk Wv], [bq bk bv], mask)
    q, k, v = Add(MatMul(DQ(Q(x, s)), DQ(W?_int8)), b?)      -> QAttention(Q(x, s, 128 as uint8), [W?_int8],
              (a QAT export: one activation quantizer)            [b?], s, per-column weight scales, mask)
    any other projections                                     -> MultiHeadAttention(t_q, t_k, t_v, attention_bias)

so q, k and v become one GEMM (float, or ONNX Runtime's u8s8 integer GEMM) inside the kernel. The window stays
a run-time input: the mask the dense lowering builds once per model from window, padding, causality and sinks
is the kernels' [B, S, S] mask (1 = attend) or additive attention_bias, and rows with no key are zeroed as in
the plain lowering. `fuse` returns None when it replaced the layer, or why the layer keeps the plain ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from edgeattn.passes.qdq_cpu import int8_operands
from edgeattn.passes.rewiring import constant, replace_value

MS = "com.microsoft"


def _only_use(value: ir.Value, op_type: str, **attrs) -> ir.Node | None:
    uses = list(value.uses())
    if len(uses) != 1 or uses[0].node.op_type != op_type:
        return None
    node = uses[0].node
    return node if all(tuple(node.attributes.get_ints(k, ())) == v for k, v in attrs.items()) else None


def _split_source(value: ir.Value, h: int, d: int) -> ir.Value | str:
    """t when value = Transpose(Reshape(t, [.., .., h, d]), perm 0 2 1 3) with t [B, S, h*d]; else why not."""
    tr = value.producer()
    if tr is None or tr.op_type != "Transpose" or tuple(tr.attributes.get_ints("perm", ())) != (0, 2, 1, 3):
        return "input is not a head split (Transpose 0 2 1 3 of a Reshape)"
    rs = tr.inputs[0].producer()
    if rs is None or rs.op_type != "Reshape":
        return "input is not a head split (Transpose 0 2 1 3 of a Reshape)"
    t = rs.inputs[0]
    if t.shape is None or len(t.shape) != 3 or t.shape[2] != h * d:
        return f"head split reads {t.shape}, not [B, S, {h * d}]"
    return t


def _merge_target(node: ir.Node, h: int, d: int) -> ir.Value | str:
    """The [B, S, h*d] value the output is merged into (Transpose 0 2 1 3, then Reshape); else why not."""
    out = node.outputs[0]
    tr = _only_use(out, "Transpose", perm=(0, 2, 1, 3))
    rs = _only_use(tr.outputs[0], "Reshape") if tr is not None and tr.outputs[0] not in tr.graph.outputs else None
    if rs is None or out in node.graph.outputs:
        return "output is not merged back (Transpose 0 2 1 3, then Reshape)"
    m = rs.outputs[0]
    if m.shape is None or len(m.shape) != 3 or m.shape[2] != h * d:
        return f"output merged into {m.shape}, not [B, S, {h * d}]"
    return m


@dataclass(frozen=True)
class Mask:
    """The dense lowering's shared mask: `ok` (bool) and `bias` (0 / -1e30) [B, 1, S_q, S_k], `any_ok` ("row has
    a key", 1 / 0) [B, 1, S_q, 1] when `padded`; without a padding input [S_q, S_k] and [S_q, 1]."""

    ok: ir.Value
    bias: ir.Value
    any_ok: ir.Value
    padded: bool


@dataclass(frozen=True)
class Projection:
    """t = Add(MatMul(x, W), b): W a float constant, or int8 from a Q/DQ MatMul (then x_scale and w_scales)."""

    x: ir.Value
    w: np.ndarray  # [E_in, E]
    b: np.ndarray  # [E]
    x_scale: float | None = None
    w_scales: np.ndarray | None = None  # [E]


def _projection(t: ir.Value) -> Projection | None:
    add = t.producer()
    if add is None or add.op_type != "Add":
        return None
    for mm_in, b_in in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        mm = mm_in.producer()
        if mm is None or mm.op_type != "MatMul" or b_in.const_value is None:
            continue
        b = b_in.const_value.numpy()
        if mm.inputs[1].const_value is not None:
            w = mm.inputs[1].const_value.numpy()
            if w.dtype == np.float32 and w.ndim == 2 and b.shape == (w.shape[1],):
                return Projection(mm.inputs[0], w, b)
            continue
        operands = int8_operands(mm)
        if not isinstance(operands, str) and b.dtype == np.float32 and b.shape == (operands[2].shape[1],):
            x, sx, w, sw = operands
            return Projection(x, w, b, float(sx.reshape(())), np.broadcast_to(sw.reshape(-1), b.shape).astype(np.float32))
    return None


def match(node: ir.Node, padded: bool) -> tuple[str, list[ir.Value], ir.Value] | str:
    """(kernel, the [B, S, E] q/k/v sources, the merged output) or why no kernel fits. The kernel is "Attention"
    (float projections of one x: packed into its GEMM), "QAttention" (int8 Q/DQ projections of one x with one
    scale, a padding mask), else "MultiHeadAttention" (any projections)."""
    q, k = node.inputs[0], node.inputs[1]
    h, hkv, d = q.shape[1], k.shape[1], q.shape[3]
    if h != hkv:
        return f"{h} query heads share {hkv} kv heads: the fused kernels here take equal head counts"
    sources = [_split_source(v, h, d) for v in node.inputs[:3]]
    for name, s in zip("qkv", sources):
        if isinstance(s, str):
            return f"{name}: {s}"
    merged = _merge_target(node, h, d)
    if isinstance(merged, str):
        return merged
    p = [_projection(t) for t in sources]
    if all(x is not None for x in p) and len({id(x.x) for x in p}) == 1:
        if all(x.x_scale is None for x in p):
            return "Attention", sources, merged
        if padded and len({x.x_scale for x in p}) == 1 and None not in {x.x_scale for x in p}:
            return "QAttention", sources, merged
    return "MultiHeadAttention", sources, merged


def fuse(graph: ir.Graph, node: ir.Node, mask: Mask, scale: float) -> str | None:
    """Replace the layer with Attention / QAttention (q/k/v packed into one GEMM) or MultiHeadAttention;
    None, or why not. The layer's old nodes are left for dead-node removal."""
    found = match(node, mask.padded)
    if isinstance(found, str):
        return found
    kind, sources, merged = found
    h = node.inputs[0].shape[1]
    ops: list[ir.Node] = []

    def op(op_type, *inputs, domain="", **attrs):
        n = ir.node(op_type, list(inputs), attributes=attrs, domain=domain, name=f"{node.name}/fused_{op_type}{len(ops)}")
        ops.append(n)
        return n.outputs[0]

    def c(name, value):
        return constant(graph, f"{node.name}/{name}" if name.startswith("qkv") else f"edgeattn_fused_{name}", value)

    bias, any_ok = mask.bias, mask.any_ok
    if not mask.padded:  # no padding input: [S_q, S_k] -> [1, 1, S_q, S_k]
        bias = op("Unsqueeze", bias, c("axes01", np.array([0, 1], np.int64)))
    p = [_projection(t) for t in sources] if kind != "MultiHeadAttention" else []
    if p:
        w = c("qkv_weight", np.concatenate([x.w for x in p], axis=1))
        b = c("qkv_bias", np.concatenate([x.b for x in p]).astype(np.float32))
    if kind != "MultiHeadAttention" and mask.padded:  # their mask input [B, S, S], 1 = attend: faster than a bias
        keys = op("Cast", op("Squeeze", mask.ok, c("axes1", np.array([1], np.int64))), to=ir.DataType.INT32)
    if kind == "Attention":
        inputs = [keys] if mask.padded else [None, None, bias]
        out = op("Attention", p[0].x, w, b, *inputs, domain=MS, num_heads=h, scale=scale, mask_filter_value=-1e30)
    elif kind == "QAttention":  # x quantized as uint8 with zero point 128: the int8 Q/DQ values, shifted
        sx = c(f"x_scale_{p[0].x_scale:.9g}", np.array(p[0].x_scale, np.float32))
        zero = c("u8_128", np.array(128, np.uint8))
        xq = op("QuantizeLinear", p[0].x, sx, zero)
        out = op("QAttention", xq, w, b, sx, c("qkv_weight_scales", np.concatenate([x.w_scales for x in p])), keys,
                 zero, c("qkv_weight_zero_points", np.zeros(w.shape[1], np.int8)), domain=MS, num_heads=h,
                 scale=scale, mask_filter_value=-1e30)
    else:
        out = op("MultiHeadAttention", *sources, None, None, bias, domain=MS, num_heads=h, scale=scale)
    if mask.padded:  # [B, 1, S_q, 1] -> [B, S_q, 1]
        any_ok = op("Squeeze", any_ok, c("axes1", np.array([1], np.int64)))
    out = op("Mul", out, any_ok)  # rows with no key at all: zeros, as the plain lowering
    out.shape, out.dtype = merged.shape, merged.dtype
    graph.insert_before(merged.producer(), ops)
    replace_value(graph, merged, out)
    for head_split, t in zip(node.inputs[:3], sources):  # shape reads (the mask's S_k): from [B, S, .] inputs
        _shape_from(graph, head_split, p[0].x if p else t, h, node.inputs[0].shape[3])
    return None


def _shape_from(graph: ir.Graph, k: ir.Value, t: ir.Value, h: int, d: int) -> None:
    """Shape(k [B, h, S, d], start:end) -> the same dims read from t [B, S, ...], so k's head split can die."""
    for use in [u for u in k.uses() if u.node.op_type == "Shape"]:
        shape, new = use.node, []

        def emit(op_type, *inputs, **attrs):
            new.append(ir.node(op_type, list(inputs), attributes=attrs, name=f"{shape.name}/from_input{len(new)}"))
            return new[-1].outputs[0]

        start, end = shape.attributes.get_int("start", 0), shape.attributes.get_int("end", 4)
        start, end = (start % 4 if start < 0 else min(start, 4)), (end % 4 if end < 0 else min(end, 4))
        dims = [lambda: emit("Shape", t, start=0, end=1),
                lambda: constant(graph, f"edgeattn_fused_dim_{h}", np.array([h], np.int64)),
                lambda: emit("Shape", t, start=1, end=2),
                lambda: constant(graph, f"edgeattn_fused_dim_{d}", np.array([d], np.int64))][start:end]
        if not dims:  # an empty slice of the shape: nothing read from k
            continue
        pieces = [dim() for dim in dims]
        out = pieces[0] if len(pieces) == 1 else emit("Concat", *pieces, axis=0)
        if out.producer() is None:  # one constant dim: nothing to insert, nothing to read
            out = emit("Identity", out)
        graph.insert_before(shape, new)
        replace_value(graph, shape.outputs[0], out)


__all__ = ["Mask", "Projection", "fuse", "match"]
