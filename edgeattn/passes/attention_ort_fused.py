"""WindowedAttention -> ONNX Runtime's fused attention kernels, for the cpu target's dense lowering.

A layer whose q, k and v are head splits of [B, S, H*D] projections and whose output is merged back to
[B, S, H*D] runs as one com.microsoft node instead of ~12 plain ops:

    Transpose(Reshape(Add(MatMul(x, Wq), bq)))  (and k, v from the same x)   -> Attention(x, [Wq Wk Wv], [bq bk bv],
    WindowedAttention(q, k, v, window, pad) -> Transpose -> Reshape             attention_bias = the shared mask)
    Transpose(Reshape(t_q)), (t_k), (t_v) of any projections (int8 ones too)  -> MultiHeadAttention(t_q, t_k, t_v,
                                                                                 attention_bias = the shared mask)

The window stays a run-time input: the additive mask the dense lowering builds once per model ([B, 1, S, S],
from window, padding, causality and sinks) is the kernels' attention_bias, and rows with no key are zeroed
as in the plain lowering. `fuse` returns None when it replaced the layer, or why the layer keeps the plain ops.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

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


def _projection(t: ir.Value) -> tuple[ir.Value, np.ndarray, np.ndarray] | None:
    """(x, W, b) when t = Add(MatMul(x, W), b) with W [E_in, E] and b [E] float constants."""
    add = t.producer()
    if add is None or add.op_type != "Add":
        return None
    for mm_in, b_in in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        mm = mm_in.producer()
        if mm is None or mm.op_type != "MatMul" or b_in.const_value is None or mm.inputs[1].const_value is None:
            continue
        w, b = mm.inputs[1].const_value.numpy(), b_in.const_value.numpy()
        if w.dtype == np.float32 and w.ndim == 2 and b.shape == (w.shape[1],):
            return mm.inputs[0], w, b
    return None


def match(node: ir.Node) -> tuple[str, list[ir.Value], ir.Value] | str:
    """("attention", [x, W, b] sources..., merged) or ("mha", [t_q, t_k, t_v], merged), or why neither fits."""
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
    projections = [_projection(t) for t in sources]
    if all(p is not None for p in projections) and len({id(p[0]) for p in projections}) == 1:
        return "attention", sources, merged
    return "mha", sources, merged


def fuse(graph: ir.Graph, node: ir.Node, bias: ir.Value, any_ok: ir.Value, scale: float, padded: bool) -> str | None:
    """Replace the layer with Attention (one packed q/k/v GEMM) or MultiHeadAttention; None, or why not.
    `bias` is the shared additive mask and `any_ok` its "row has a key" factor: [B, 1, S_q, S_k] and
    [B, 1, S_q, 1] when `padded`, else [S_q, S_k] and [S_q, 1]. The layer's nodes are left for dead-node removal."""
    found = match(node)
    if isinstance(found, str):
        return found
    kind, sources, merged = found
    h = node.inputs[0].shape[1]
    ops: list[ir.Node] = []

    def op(op_type, *inputs, domain="", **attrs):
        n = ir.node(op_type, list(inputs), attributes=attrs, domain=domain, name=f"{node.name}/fused_{op_type}{len(ops)}")
        ops.append(n)
        return n.outputs[0]

    if not padded:  # no padding input: [S_q, S_k] -> [1, 1, S_q, S_k]
        bias = op("Unsqueeze", bias, constant(graph, "edgeattn_fused_axes01", np.array([0, 1], np.int64)))
    if kind == "attention":
        (x, *_), weights = _projection(sources[0]), [_projection(t) for t in sources]
        w = constant(graph, f"{node.name}/qkv_weight", np.concatenate([p[1] for p in weights], axis=1))
        b = constant(graph, f"{node.name}/qkv_bias", np.concatenate([p[2] for p in weights]))
        out = op("Attention", x, w, b, None, None, bias, domain=MS, num_heads=h, scale=scale)
    else:
        out = op("MultiHeadAttention", *sources, None, None, bias, domain=MS, num_heads=h, scale=scale)
    if padded:  # [B, 1, S_q, 1] -> [B, S_q, 1]
        any_ok = op("Squeeze", any_ok, constant(graph, "edgeattn_fused_axes1", np.array([1], np.int64)))
    out = op("Mul", out, any_ok)  # rows with no key at all: zeros, as the plain lowering
    out.shape, out.dtype = merged.shape, merged.dtype
    graph.insert_before(merged.producer(), ops)
    replace_value(graph, merged, out)
    base = x if kind == "attention" else None
    for head_split, t in zip(node.inputs[:3], sources):  # shape reads (the mask's S_k): from [B, S, .] inputs
        _shape_from(graph, head_split, base or t, h, node.inputs[0].shape[3])
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


__all__ = ["fuse", "match"]
