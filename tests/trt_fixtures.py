"""Small ONNX models for TensorRT builds, made in code: fp32/fp16 MLP, INT8 Q/DQ, INT4 weight-only,
and a model with one edgeattn::WindowedAttention node (plus a tiny dense-mask local function body)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HIDDEN = 64


def _model(nodes, inputs, outputs, inits, opset, functions=(), domains=()):
    graph = helper.make_graph(nodes, "fixture", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]
                              + [helper.make_opsetid(d, 1) for d in domains], functions=list(functions))
    model.ir_version = 10 if opset >= 21 else 9
    onnx.checker.check_model(model)
    return model


def _io(name="x", dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, ["batch", "seq", HIDDEN])


def mlp(opset: int = 18, seed: int = 0) -> onnx.ModelProto:
    """x [batch, seq, 64] -> MatMul -> Add -> Relu -> MatMul -> y: two float compute layers."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((HIDDEN, HIDDEN)) * 0.1).astype(np.float32), n)
             for n in ("w1", "w2")] + [numpy_helper.from_array(np.zeros(HIDDEN, np.float32), "b1")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="fc1_bias"),
             helper.make_node("Relu", ["hb"], ["r"], name="act"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2")]
    return _model(nodes, [_io()], [_io("y")], inits, opset)


def _qdq_weight(rng, name, bits, block=None):
    w = (rng.standard_normal((HIDDEN, HIDDEN)) * 0.1).astype(np.float32)
    qmax = 127 if bits == 8 else 7
    if block is None:  # per output channel (axis 1 of a MatMul B)
        scale = np.abs(w).max(axis=0) / qmax
        q = np.clip(np.round(w / scale), -qmax, qmax)
    else:  # blocks of `block` along K (axis 0)
        scale = np.abs(w.reshape(HIDDEN // block, block, HIDDEN)).max(axis=1) / qmax
        q = np.clip(np.round(w / np.repeat(scale, block, axis=0)), -qmax, qmax)
    dtype = TensorProto.INT8 if bits == 8 else TensorProto.INT4
    qt = helper.make_tensor(f"{name}_q", dtype, q.shape, q.astype(np.int8).flatten().tolist())
    return qt, numpy_helper.from_array(scale.astype(np.float32), f"{name}_scale")


def int8_qdq(opset: int = 19, seed: int = 0) -> onnx.ModelProto:
    """W8A8: per-channel int8 weights, per-tensor int8 activations, on both MatMuls."""
    rng = np.random.default_rng(seed)
    inits, nodes, src = [], [], "x"
    for i in (1, 2):
        qt, sc = _qdq_weight(rng, f"w{i}", 8)
        inits += [qt, sc, numpy_helper.from_array(np.array(0.05, np.float32), f"a{i}_scale")]
        nodes += [helper.make_node("QuantizeLinear", [src, f"a{i}_scale"], [f"a{i}_q"], name=f"q_act{i}"),
                  helper.make_node("DequantizeLinear", [f"a{i}_q", f"a{i}_scale"], [f"a{i}_dq"], name=f"dq_act{i}"),
                  helper.make_node("DequantizeLinear", [f"w{i}_q", f"w{i}_scale"], [f"w{i}"], axis=1, name=f"dq_w{i}"),
                  helper.make_node("MatMul", [f"a{i}_dq", f"w{i}"], [f"h{i}" if i == 1 else "y"], name=f"fc{i}")]
        if i == 1:
            nodes.append(helper.make_node("Relu", ["h1"], ["r1"], name="act"))
            src = "r1"
    return _model(nodes, [_io()], [_io("y")], inits, opset)


def int4_weight_only(opset: int = 21, block: int = 32, seed: int = 0) -> onnx.ModelProto:
    """W4: block-wise int4 weights (blocks along K), float activations."""
    rng = np.random.default_rng(seed)
    inits, nodes, src = [], [], "x"
    for i in (1, 2):
        qt, sc = _qdq_weight(rng, f"w{i}", 4, block)
        inits += [qt, sc]
        nodes += [helper.make_node("DequantizeLinear", [f"w{i}_q", f"w{i}_scale"], [f"w{i}"], axis=0,
                                   block_size=block, name=f"dq_w{i}"),
                  helper.make_node("MatMul", [src, f"w{i}"], [f"h{i}" if i == 1 else "y"], name=f"fc{i}")]
        if i == 1:
            nodes.append(helper.make_node("Relu", ["h1"], ["r1"], name="act"))
            src = "r1"
    return _model(nodes, [_io()], [_io("y")], inits, opset)


def _attention_body(rank: int) -> onnx.FunctionProto:
    """Dense-mask body (full attention, ignores window and sinks): softmax(q k^T / sqrt(D)) v."""
    perm = [0, 1, 3, 2] if rank == 4 else [0, 2, 1]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=perm),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Shape", ["q"], ["qs"], start=-1),
             helper.make_node("Cast", ["qs"], ["d"], to=TensorProto.FLOAT),
             helper.make_node("Sqrt", ["d"], ["sd"]),
             helper.make_node("Div", ["s", "sd"], ["ss"]),
             helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["out"])]
    return helper.make_function("edgeattn", "WindowedAttention", ["q", "k", "v", "window"], ["out"], nodes,
                                [helper.make_opsetid("", 18)], attributes=["causal", "sinks", "scale"])


def attention(heads: int = 2, dim: int = 16, rank: int = 4, opset: int = 18) -> onnx.ModelProto:
    """q, k, v projections of x, one WindowedAttention node, an output projection.

    rank 4: q/k/v [B, H, S, D] (what the plugin takes); rank 3: [B, S, H*D] with a rank-3 body, which the
    plugin cannot take (the unfusable-on-purpose case)."""
    rng = np.random.default_rng(1)
    inner = heads * dim
    inits = [numpy_helper.from_array((rng.standard_normal((HIDDEN, inner)) * 0.1).astype(np.float32), f"w{n}")
             for n in "qkv"]
    inits.append(numpy_helper.from_array((rng.standard_normal((inner, HIDDEN)) * 0.1).astype(np.float32), "wo"))
    inits.append(numpy_helper.from_array(np.array([0, 0, heads, dim], np.int64), "split_shape"))
    inits.append(numpy_helper.from_array(np.array([0, 0, inner], np.int64), "merge_shape"))
    nodes = []
    for n in "qkv":
        nodes.append(helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}_flat"], name=f"proj_{n}"))
        if rank == 4:
            nodes += [helper.make_node("Reshape", [f"{n}_flat", "split_shape"], [f"{n}_bshd"], name=f"split_{n}"),
                      helper.make_node("Transpose", [f"{n}_bshd"], [n], perm=[0, 2, 1, 3], name=f"heads_{n}")]
        else:
            nodes.append(helper.make_node("Identity", [f"{n}_flat"], [n], name=f"id_{n}"))
    nodes.append(helper.make_node("WindowedAttention", ["q", "k", "v", "window"], ["ctx"], domain="edgeattn",
                                  name="attn0", causal=0, sinks=0, scale=0.0))
    if rank == 4:
        nodes += [helper.make_node("Transpose", ["ctx"], ["ctx_bshd"], perm=[0, 2, 1, 3], name="merge_t"),
                  helper.make_node("Reshape", ["ctx_bshd", "merge_shape"], ["ctx_flat"], name="merge")]
    else:
        nodes.append(helper.make_node("Identity", ["ctx"], ["ctx_flat"], name="merge"))
    nodes.append(helper.make_node("MatMul", ["ctx_flat", "wo"], ["y"], name="proj_o"))
    window = helper.make_tensor_value_info("window", TensorProto.INT64, [])
    return _model(nodes, [_io(), window], [_io("y")], inits, opset, [_attention_body(rank)], ["edgeattn"])


def plain_softmax_attention() -> onnx.ModelProto:
    """Attention written as plain ops (no WindowedAttention node): nothing for the plugin to take."""
    from onnx import inliner

    inlined = inliner.inline_local_functions(attention())
    del inlined.opset_import[:]
    inlined.opset_import.extend([helper.make_opsetid("", 18)])
    return inlined
