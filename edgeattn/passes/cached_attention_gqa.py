"""edgeattn::CachedWindowedAttention on ONNX Runtime's com.microsoft.GroupQueryAttention (cpu target, opt-in:
`edgeattn build --cached-attention fused`).

The plain lowering (cached_attention_cpu) runs ~30 small nodes a layer; at a short context a decode step
spends more time between them than in attention. GroupQueryAttention does the rotation of the query and key,
the scores, the softmax and the weighted sum in one node. It reads a past that it extends with the chunk's
keys, so the ring is given to it as one GatherND of the live rows, in the body's order, with S rows of room
at the end (GroupQueryAttention then writes the chunk's keys in place instead of copying the past):

    past keys   [B, H_kv, S*NS + N + S, D] = GatherND(ring, the sinks once per query row, the window rows, S spare)
    bias        [B, 1, S, S*NS + N + S]: 0 where the body's masks allow, -inf elsewhere; row s reads
                only its own copy of the sinks

The trade-off (benchmarks/cpu_attention_kernels.py): at one query row ONNX Runtime's CPU kernel is 2-3x
slower per cached row than the MatMul/Softmax/MatMul of the plain form, so this form wins at short contexts
and loses once the window holds a few hundred rows; hence opt-in.

The sinks are the one place where the body scores with a second query rotation (at p = min(t, sinks + W),
docs/windowed-attention.md "Cached form"). A dot product of two rotated vectors depends only on the
difference of their angles, so scoring R(p) q against R(j) k is scoring R(t) q against R(t - p) R(j) k: each
query row's copy of the sink keys is rotated by the angles f_t - f_p of that row (a table of B*S rows, then
rows of zero angles that leave the window keys as they are), and one query rotation serves every key.
The stored keys are never re-rotated: only the gathered copy is. A node the pass cannot see through (a
rotation that is not RotaryEmbedding over fuse-rotary-cpu's angle tables) keeps the plain lowering, with the
reason in the build report.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx_ir as ir

from edgeattn.passes.rotary_cpu import MS, table_angles

GQA_INPUTS = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
              "cos_cache", "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale",
              "q_norm_weight", "k_norm_weight", "query_seqlens")


@functools.cache
def unavailable() -> str | None:
    """Why this onnxruntime cannot run the form (None when it can): it needs GroupQueryAttention's
    position_ids, attention_bias and query_seqlens inputs, in the order above."""
    import onnxruntime
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    for schema in C.get_all_operator_schema():
        if schema.name == "GroupQueryAttention" and schema.domain == MS:
            names = tuple(i.name for i in schema.inputs)
            if names[:len(GQA_INPUTS)] == GQA_INPUTS:
                return None
            return (f"onnxruntime {onnxruntime.__version__}'s GroupQueryAttention has inputs {list(names)}: "
                    f"expected position_ids, attention_bias and query_seqlens")
    return f"onnxruntime {onnxruntime.__version__} has no com.microsoft GroupQueryAttention"


def _rotary(value: ir.Value) -> ir.Node | None:
    node = value.producer()
    if node is None or node.op_type != "RotaryEmbedding" or node.domain != MS or len(node.inputs) != 4:
        return None
    if node.attributes.get_int("interleaved", 0) or node.attributes.get_int("rotary_embedding_dim", 0) \
            or node.attributes.get_int("num_heads", 0) or node.attributes.get_float("scale", 1.0) != 1.0:
        return None
    return node


def match(node: ir.Node, sinks: int) -> dict | str:
    """What the fused form reads, or why this node keeps the plain lowering."""
    q, q_sink, k = node.inputs[0], node.inputs[1], node.inputs[2]
    rq, rk = _rotary(q), _rotary(k)
    if rq is None or rk is None:
        return "the query or key is not a half-rotation RotaryEmbedding"
    if list(rq.inputs[1:]) != list(rk.inputs[1:]):
        return "the query and the key are not rotated by the same tables"
    f_t = table_angles(rq)
    if f_t is None:
        return "the rotation tables are not Cos / Sin of the step's angles"
    found = {"xq": rq.inputs[0], "xk": rk.inputs[0], "pid": rq.inputs[1], "cos": rq.inputs[2], "sin": rq.inputs[3],
             "f_t": f_t, "f_p": None}
    if sinks:
        rs = _rotary(q_sink)
        if rs is None or rs.inputs[0] is not rq.inputs[0]:
            return "the sink query is not the same query rotated by a second table"
        f_p = table_angles(rs)
        if f_p is None or f_p.shape is None or f_t.shape is None or list(f_p.shape) != list(f_t.shape):
            return "the sink query's angles are not a table of the step's shape"
        found["f_p"] = f_p
    return found


def bsnh_source(x4: ir.Value, heads: int, d: int) -> ir.Value | None:
    """x3 [B, S, heads*D] when x4 = Transpose(Reshape(x3, [B, S, heads, D]), perm=[0, 2, 1, 3])."""
    t = x4.producer()
    if t is None or t.op_type != "Transpose" or list(t.attributes.get_ints("perm", [])) != [0, 2, 1, 3]:
        return None
    r = t.inputs[0].producer()
    if r is None or r.op_type != "Reshape":
        return None
    x3, y = r.inputs[0], r.outputs[0]
    if x3.shape is None or y.shape is None or len(x3.shape) != 3 or len(y.shape) != 4:
        return None
    if x3.shape[2] != heads * d or y.shape[2] != heads or y.shape[3] != d:
        return None
    same = all(isinstance(a, int) and a == b or isinstance(a, ir.SymbolicDim) and a.value is not None and a == b
               for a, b in zip(x3.shape[:2], y.shape[:2]))
    return x3 if same else None


def shape_source(xq: ir.Value, h: int, d: int) -> ir.Value | None:
    """A [B, S, ...] tensor to read the step's shapes from that the fused form keeps computing anyway: the
    input of the query's projection (so the projections can be packed into one product the op reads whole)."""
    x3 = bsnh_source(xq, h, d)
    proj = x3.producer() if x3 is not None else None
    if proj is not None and proj.op_type in ("MatMul", "MatMulNBits") and proj.inputs[0].shape is not None \
            and len(proj.inputs[0].shape) == 3:
        return proj.inputs[0]
    return x3


def geometry(op, c, i64, geo: dict, *, sinks: int, hkv: int) -> dict[str, ir.Value]:
    """From the ring geometry: the ring slots [B, H_kv, S*NS + N, 1] of the keys read, the bias [B, 1, S, L'] (L' = S*NS + N + S),
    GroupQueryAttention's lengths, where the chunk's own rows start in its present outputs, and the position
    ids [B, S*NS + N] of the gathered keys in a table of B*S offset rows and then rows of zero angles."""
    bsz, sq, n, pos, qi = geo["bsz"], geo["sq"], geo["n"], geo["pos"], geo["qi"]
    axes0, axes1 = c("axes0", i64([0])), c("axes1", i64([1]))
    i0, i1 = c("i0", i64(0)), c("i1", i64(1))
    bsz_1d = op("Unsqueeze", bsz, axes0)
    out: dict[str, ir.Value] = {}
    if sinks:
        ns = c(f"ns_scalar_{sinks}", i64(sinks))
        cols = op("Range", i0, op("Mul", sq, ns), i1)  # [S*NS]: column s*NS + j is sink j for query row s
        slots = op("Concat", op("Expand", op("Unsqueeze", op("Mod", cols, ns), axes0),
                                op("Concat", bsz_1d, c("i1_1", i64([1])), axis=0)),
                   geo["slots"], axis=-1)  # [B, S*NS + N]
        own = op("Equal", op("Unsqueeze", op("Div", cols, ns), axes0), qi)  # [S, S*NS]
        filled = op("Less", op("Unsqueeze", op("Mod", cols, ns), axes0), pos)  # [B, S*NS]: sink j already cached
        ok_s = op("And", op("Unsqueeze", own, axes0), op("Unsqueeze", filled, axes1))  # [B, S, S*NS]
        ok = op("Concat", ok_s, geo["ok_w"], geo["ok_n"], axis=-1)
        count = op("Mul", bsz, sq)
        pid_s = op("Reshape", op("Range", i0, count, i1), op("Concat", bsz_1d, c("neg1_1", i64([-1])), axis=0))
        pid_s = op("Reshape", op("Expand", op("Unsqueeze", pid_s, c("axes2", i64([2]))),
                                 op("Concat", bsz_1d, geo["sq_1d"], c(f"ns_1_{sinks}", i64([sinks])), axis=0)),
                   op("Concat", bsz_1d, c("neg1_1", i64([-1])), axis=0))  # [B, S*NS]: row b*S + s of the table
        pid_w = op("Expand", count, op("Concat", bsz_1d, op("Unsqueeze", op("Add", n, sq), axes0), axis=0))  # [B, N + S]
        out["pid_past"] = op("Concat", pid_s, pid_w, axis=1)
        past = op("Add", op("Mul", sq, ns), n)
        out["past_pads"] = op("Concat", c("i00_2", i64([0, 0])), op("Unsqueeze", op("Add", past, sq), axes0),
                              c("i0_1", i64([0])), axis=0)
    else:
        slots, ok, past = geo["slots"], op("Concat", geo["ok_w"], geo["ok_n"], axis=-1), n
    total = op("Add", past, sq)
    bias = op("Where", ok, c("f0", np.array(0.0, np.float32)), c("fneginf", np.array(-np.inf, np.float32)))
    out.update({
        # [B, H_kv, S*NS + N + S, 1]: the ring slot of each key read, for GatherND over [B, H_kv, C, D],
        # and S rows more (slot 0, never read): GroupQueryAttention then writes the chunk's keys in place
        "slots": op("Expand", op("Unsqueeze", op("Concat", slots, op("Expand", i0, op("Concat", bsz_1d, geo["sq_1d"],
                                                                                      axis=0)), axis=-1),
                                 c("axes1_3", i64([1, 3]))),
                    op("Concat", bsz_1d, c(f"hkv_1_1_{hkv}", i64([hkv, 1, 1])), axis=0)),
        "bias": op("Unsqueeze", bias, axes1),  # [B, 1, S, L']
        "seqlens": op("Cast", op("Expand", op("Sub", total, i1), bsz_1d), to=ir.DataType.INT32),  # [B]
        "total": op("Cast", total, to=ir.DataType.INT32),
        "query_seqlens": op("Cast", op("Expand", sq, bsz_1d), to=ir.DataType.INT32),  # [B]
        "new_from": op("Unsqueeze", past, axes0), "new_to": op("Unsqueeze", total, axes0),  # [1]
        "rotary_pads": op("Concat", c("i00_2", i64([0, 0])), op("Unsqueeze", total, axes0), c("i0_1", i64([0])),
                          axis=0),  # [4]: GroupQueryAttention wants cos_cache rows >= total_sequence_length
    })
    return out


def _bsh(op, c, i64, x4: ir.Value, heads: int, *, d: int) -> ir.Value:
    """[B, S, heads*D] from x4 [B, heads, S, D]: its source when it was made by Reshape + Transpose."""
    x3 = bsnh_source(x4, heads, d)
    return x3 if x3 is not None else op("Reshape", op("Transpose", x4, perm=[0, 2, 1, 3]),
                                        c(f"bsh_{heads * d}", i64([0, 0, heads * d])))


def fast_path_geometry(op, c, i64, x3: ir.Value, position: ir.Value) -> dict[str, ir.Value]:
    """For the fast path: GroupQueryAttention's lengths from the stream positions, each stream's keys at
    rows [0, position + S) of its buffer (valid while no stream has left its window: no ring wrap)."""
    axes0 = c("axes0", i64([0]))
    pos = op("Cast", position, to=ir.DataType.INT64)  # [B]
    bsz_1d = op("Shape", x3, start=0, end=1)
    sq = op("Reshape", op("Shape", x3, start=1, end=2), c("scalar_shape", i64([])))
    total = op("Add", op("ReduceMax", pos, keepdims=0), sq)
    return {
        "seqlens": op("Cast", op("Sub", op("Add", pos, sq), c("i1", i64(1))), to=ir.DataType.INT32),  # [B]
        "total": op("Cast", total, to=ir.DataType.INT32),
        "query_seqlens": op("Cast", op("Expand", sq, bsz_1d), to=ir.DataType.INT32),
        "rotary_pads": op("Concat", c("i00_2", i64([0, 0])), op("Unsqueeze", total, axes0), c("i0_1", i64([0])),
                          axis=0),
    }


def inverse_frequencies(f: ir.Value) -> np.ndarray | None:
    """inv [D/2] when the angles are f = Cast(Unsqueeze(positions)) * inv, inv a constant (Hugging Face's
    rotary embedding as exported): then the angle of position p is float32(p) * inv, and the rotation tables can
    be constants indexed by position."""
    node = f.producer()
    if node is None or node.op_type != "Mul" or len(node.inputs) != 2:
        return None
    for cast, freq in (node.inputs, node.inputs[::-1]):
        inv = freq.const_value.numpy() if freq is not None and freq.const_value is not None else None
        producer = cast.producer() if cast is not None else None
        if inv is None or producer is None or producer.op_type != "Cast" or inv.dtype != np.float32:
            continue
        if producer.attributes.get_int("to", 0) == ir.DataType.FLOAT and inv.size == max(inv.shape or (1,)):
            return inv.reshape(-1)
    return None


def position_tables(inv: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """cos / sin [rows, D/2] of float32(p) * inv for p = 0 .. rows - 1, the product in float32 as the graph
    computes it."""
    angles = np.arange(rows, dtype=np.float32)[:, None] * inv[None, :].astype(np.float32)
    return np.cos(angles.astype(np.float64)).astype(np.float32), np.sin(angles.astype(np.float64)).astype(np.float32)


def emit_fast_path(op, c, i64, node: ir.Node, found: dict, shared: dict, tables, *, h: int, hkv: int, d: int,
                scale: float, constant_tables: tuple[ir.Value, ir.Value] | None = None
                ) -> tuple[ir.Value, ir.Value, ir.Value]:
    """The fast path of one node: GroupQueryAttention reading and extending the cache buffers themselves
    (run with the present outputs bound to the past inputs' memory, it writes the chunk's keys in place).
    `constant_tables`: cos / sin caches indexed by position (the op then takes each row's position from the
    stream's length, no position_ids), else the step's own tables padded to the total length.
    Returns (its [B, H, S, D] output, the whole key buffer, the whole value buffer)."""
    v, pk, pv = node.inputs[3], node.inputs[4], node.inputs[5]
    bsnh = functools.partial(_bsh, op, c, i64, d=d)
    cos, sin = constant_tables or tables("padded", found["cos"], found["sin"])
    o3, present_k, present_v = op(
        "GroupQueryAttention", bsnh(found["xq"], h), bsnh(found["xk"], hkv), bsnh(v, hkv), pk, pv,
        shared["seqlens"], shared["total"], cos, sin, None if constant_tables else found["pid"], None, None, None,
        None, None, None,
        shared["query_seqlens"], outputs=3, num_heads=h, kv_num_heads=hkv, scale=scale, do_rotary=1,
        rotary_interleaved=0, _domain=MS)  # presents: the buffers, [B, H_kv, C, D]
    o4 = op("Reshape", o3, c(f"heads_bsnh_{h}_{d}", i64([0, 0, h, d])))  # [B, S, H, D]
    out = op("Transpose", o4, perm=[0, 2, 1, 3])  # [B, H, S, D]
    q = node.inputs[0]
    o3.shape, o3.dtype = ir.Shape([q.shape[0], q.shape[2], h * d]), q.dtype
    o4.shape, o4.dtype = ir.Shape([q.shape[0], q.shape[2], h, d]), q.dtype
    for present, past in ((present_k, pk), (present_v, pv)):
        present.shape, present.dtype = past.shape, past.dtype
    return out, present_k, present_v


def offset_tables(op, c, i64, f_t: ir.Value, f_p: ir.Value, pads: ir.Value) -> tuple[ir.Value, ir.Value]:
    """cos / sin [B*S + S*NS + N, D/2] of the angles f_t - f_p of each query row, then rows of zero angles
    (RotaryEmbedding wants at least as many rows as the keys it rotates)."""
    half = f_t.shape[2]
    rows = op("Pad", op("Reshape", op("Sub", f_t, f_p), c(f"rotary_rows_{half}", i64([-1, half]))), pads)
    return op("Cos", rows), op("Sin", rows)


def emit(op, c, i64, node: ir.Node, found: dict, shared: dict, tables, *, sinks: int, h: int, hkv: int, d: int,
         scale: float) -> tuple[ir.Value, ir.Value, ir.Value]:
    """The fused form of one node; returns (its [B, H, S, D] output, the chunk's rotated keys, its values),
    each [B, H(_kv), S, D] like the values the node read."""
    v, pk, pv = node.inputs[3], node.inputs[4], node.inputs[5]
    perm = [0, 2, 1, 3]
    bsnh = functools.partial(_bsh, op, c, i64, d=d)

    past_k = op("GatherND", pk, shared["slots"], batch_dims=2)  # [B, H_kv, S*NS + N + S, D]
    if sinks:
        cos_off, sin_off = tables("offset", found["f_t"], found["f_p"])
        past_k = op("RotaryEmbedding", past_k, shared["pid_past"], cos_off, sin_off, interleaved=0, _domain=MS)
    past_v = op("GatherND", pv, shared["slots"], batch_dims=2)
    cos, sin = tables("padded", found["cos"], found["sin"])
    o3, present_k, present_v = op(
        "GroupQueryAttention", bsnh(found["xq"], h), bsnh(found["xk"], hkv), bsnh(v, hkv), past_k, past_v,
        shared["seqlens"], shared["total"], cos, sin, found["pid"], shared["bias"], None, None, None, None, None,
        shared["query_seqlens"], outputs=3, num_heads=h, kv_num_heads=hkv, scale=scale, do_rotary=1,
        rotary_interleaved=0, _domain=MS)  # o3: [B, S, H*D]; presents: [B, H_kv, S*NS + N + S, D]
    axis2 = c("axis2", i64([2]))
    k_new = op("Slice", present_k, shared["new_from"], shared["new_to"], axis2)  # [B, H_kv, S, D], rotated
    v_new = op("Slice", present_v, shared["new_from"], shared["new_to"], axis2)
    o4 = op("Reshape", o3, c(f"heads_bsnh_{h}_{d}", i64([0, 0, h, d])))  # [B, S, H, D]
    out = op("Transpose", o4, perm=perm)  # [B, H, S, D]
    q = node.inputs[0]
    o3.shape, o3.dtype = ir.Shape([q.shape[0], q.shape[2], h * d]), q.dtype
    o4.shape, o4.dtype = ir.Shape([q.shape[0], q.shape[2], h, d]), q.dtype
    return out, k_new, v_new
