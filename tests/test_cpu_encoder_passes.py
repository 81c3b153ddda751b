"""The cpu build's fused attention kernels (passes/attention_ort_fused.py, run by the attention-body pass):
which layers become com.microsoft Attention / MultiHeadAttention, why the others keep plain ops, and the
fused model against the float64 reference at several windows, with padding."""

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeattn.attention.onnx_node import attach_function, make_node
from edgeattn.attention.reference import windowed_attention_np
from edgeattn.passes import PassContext
from edgeattn.passes.attention_body import AttentionBody
from edgeattn.targets import get_target

H, D = 3, 4
E = H * D


X_SCALE = 0.03


def int8_weights(rng) -> dict:
    """Per-column symmetric int8 weights, |w| <= 63 (so a u8 x s8 pair sum stays in int16 on CPUs without VNNI)."""
    out = {}
    for n in "qkv":
        out[f"w{n}_int8"] = rng.integers(-63, 64, (E, E)).astype(np.int8)
        out[f"w{n}_scale"] = (rng.random(E) * 0.01 + 0.005).astype(np.float32)
    return out


def quantized(x: np.ndarray, scale: float) -> np.ndarray:
    return np.clip(np.round(x / scale), -128, 127) * scale  # np.round: half to even, as QuantizeLinear


def encoder_layer(causal: int = 0, sinks: int = 0, weights_as_inputs: bool = False, merge: bool = True,
                  padded: bool = True, seed: int = 0, int8: bool = False) -> tuple[onnx.ModelProto, dict]:
    """x [B, S, E] -> q, k, v projections -> head splits -> WindowedAttention -> [B, S, E] (a BERT layer's
    attention as the exporters write it; `int8`: a QAT export's Q/DQ projections). Returns the model and its
    constants (the float weights `w?` the Q/DQ ones stand for)."""
    rng = np.random.default_rng(seed)
    consts = {f"w{n}": (rng.standard_normal((E, E)) * 0.3).astype(np.float32) for n in "qkv"}
    consts.update({f"b{n}": (rng.standard_normal(E) * 0.1).astype(np.float32) for n in "qkv"})
    if int8:
        q8 = int8_weights(rng)
        consts.update({f"w{n}": q8[f"w{n}_int8"].astype(np.float32) * q8[f"w{n}_scale"] for n in "qkv"})
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", E]),
              helper.make_tensor_value_info("window", TensorProto.INT64, [])]
    if padded:
        inputs.append(helper.make_tensor_value_info("pad", TensorProto.INT64, ["b", "s"]))
    if weights_as_inputs:  # weights that are not constants: the packed Attention op cannot take them
        inputs += [helper.make_tensor_value_info(f"w{n}", TensorProto.FLOAT, [E, E]) for n in "qkv"]
    nodes = []
    if int8:  # one activation quantizer for q, k and v, per-column weight scales
        nodes += [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["xq"]),
                  helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zero"], ["xdq"])]
        nodes += [helper.make_node("DequantizeLinear", [f"w{n}_int8", f"w{n}_scale", f"w{n}_zero"], [f"w{n}"], axis=1)
                  for n in "qkv"]
    for n in "qkv":
        nodes += [helper.make_node("MatMul", ["xdq" if int8 else "x", f"w{n}"], [f"m{n}"]),
                  helper.make_node("Add", [f"m{n}", f"b{n}"], [f"a{n}"]),
                  helper.make_node("Reshape", [f"a{n}", "split"], [f"r{n}"]),
                  helper.make_node("Transpose", [f"r{n}"], [n], perm=[0, 2, 1, 3])]
    nodes.append(make_node("q", "k", "v", "window", "pad" if padded else None, out="o", causal=causal, sinks=sinks,
                           name="attn"))
    out_name = "y" if merge else "o"
    if merge:
        nodes += [helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", ["ot", "merge"], ["y"])]
    out_dims = ["b", "s", E] if merge else ["b", H, "s", D]
    float_weights = not (weights_as_inputs or int8)
    inits = [numpy_helper.from_array(a, k) for k, a in consts.items() if float_weights or not k.startswith("w")]
    if int8:
        inits += [numpy_helper.from_array(a, k) for k, a in q8.items()]
        inits += [numpy_helper.from_array(np.zeros(E, np.int8), f"w{n}_zero") for n in "qkv"]
        inits += [numpy_helper.from_array(np.array(X_SCALE, np.float32), "x_scale"),
                  numpy_helper.from_array(np.array(0, np.int8), "x_zero")]
    inits += [numpy_helper.from_array(np.array([0, 0, H, D], np.int64), "split"),
              numpy_helper.from_array(np.array([0, 0, E], np.int64), "merge")]
    output = helper.make_tensor_value_info(out_name, TensorProto.FLOAT, out_dims)
    graph = helper.make_graph(nodes, "layer", inputs, [output], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    attach_function(model)
    if not padded:  # the node as four inputs (attach_function gave it an all-true mask from k's shape)
        node = next(n for n in model.graph.node if n.op_type == "WindowedAttention")
        del node.input[4]
    return model, consts


def reference(feeds: dict, consts: dict, causal: int, sinks: int, merge: bool = True, int8: bool = False) -> np.ndarray:
    x = quantized(feeds["x"].astype(np.float64), X_SCALE) if int8 else feeds["x"].astype(np.float64)
    heads = [(x @ consts[f"w{n}"] + consts[f"b{n}"]).reshape(*x.shape[:2], H, D).transpose(0, 2, 1, 3) for n in "qkv"]
    pad = feeds["pad"].astype(bool) if "pad" in feeds else None
    o = windowed_attention_np(*heads, int(feeds["window"]), sinks=sinks, causal=bool(causal), key_padding_mask=pad)
    return o.transpose(0, 2, 1, 3).reshape(*x.shape[:2], E) if merge else o


def lower(model: onnx.ModelProto):
    ir_model = ir.serde.deserialize_model(model)
    result = AttentionBody()(ir_model, PassContext(get_target("cpu"), seq=(1, 16, 64)))
    return ir.serde.serialize_model(ir_model), result


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def worst_error(model: onnx.ModelProto, consts: dict, causal: int, sinks: int, merge: bool = True,
                padded: bool = True, extra: dict | None = None, int8: bool = False) -> float:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    worst = 0.0
    for window in (0, 1, 3, 40):
        feeds = {"x": rng.standard_normal((3, 9, E)).astype(np.float32), "window": np.array(window, np.int64)}
        if padded:
            feeds["pad"] = (rng.random((3, 9)) > 0.3).astype(np.int64)
            feeds["pad"][1] = 0  # a fully padded sequence: zeros, not NaN
        feeds.update(extra or {})
        got = sess.run(None, feeds)[0]
        worst = max(worst, float(np.abs(got - reference(feeds, consts, causal, sinks, merge, int8)).max()))
    return worst


@pytest.mark.parametrize("causal,sinks,padded", [(0, 0, True), (1, 2, True), (0, 0, False), (1, 0, False)])
def test_projected_layer_becomes_one_attention_op(causal, sinks, padded):
    model, consts = encoder_layer(causal, sinks, padded=padded)
    fused, result = lower(model)
    assert result.details["fused_kernels"] == 1 and not result.details["plain_ops"]
    assert ops(fused).count("Attention") == 1
    assert not {"MatMul", "Softmax", "Transpose", "WindowedAttention"} & set(ops(fused))  # q/k/v GEMMs packed in
    assert worst_error(fused, consts, causal, sinks, padded=padded) < 1e-5


def test_projections_without_constant_weights_use_multi_head_attention():
    model, consts = encoder_layer(weights_as_inputs=True)
    fused, result = lower(model)
    assert result.details["fused_kernels"] == 1
    assert ops(fused).count("MultiHeadAttention") == 1 and "Attention" not in ops(fused) and "Softmax" not in ops(fused)
    assert worst_error(fused, consts, 0, 0, extra={f"w{n}": consts[f"w{n}"] for n in "qkv"}) < 1e-5


def test_unmerged_output_keeps_plain_ops_and_says_why():
    model, consts = encoder_layer(merge=False)
    fused, result = lower(model)
    assert result.details["fused_kernels"] == 0
    assert result.details["plain_ops"] == {"attn": "output is not merged back (Transpose 0 2 1 3, then Reshape)"}
    assert "plain ops: output is not merged back" in result.summary
    assert "Softmax" in ops(fused) and "Attention" not in ops(fused)
    assert worst_error(fused, consts, 0, 0, merge=False) < 1e-5


def test_inputs_that_are_not_head_splits_keep_plain_ops():
    from test_attention_body_pass import two_layers  # q, k, v are graph inputs [B, H, S, D]; GQA in the second

    for args, why in (((1, 0, 4, 4, 9, 9), "q: input is not a head split (Transpose 0 2 1 3 of a Reshape)"),
                      ((1, 0, 4, 2, 9, 9), "4 query heads share 2 kv heads: the fused kernels here take equal head counts")):
        _, result = lower(two_layers(*args))
        assert set(result.details["plain_ops"].values()) == {why}


@pytest.mark.parametrize("causal,sinks", [(0, 0), (1, 1)])
def test_int8_projections_become_one_qattention_op(causal, sinks):
    model, consts = encoder_layer(causal, sinks, int8=True)
    assert worst_error(model, consts, causal, sinks, int8=True) < 1e-5  # the Q/DQ source against the reference
    fused, result = lower(model)
    assert result.details["fused_kernels"] == 1
    assert ops(fused).count("QAttention") == 1 and ops(fused).count("QuantizeLinear") == 1
    assert not {"MatMul", "DequantizeLinear", "Softmax", "WindowedAttention"} & set(ops(fused))
    assert worst_error(fused, consts, causal, sinks, int8=True) < 1e-4


def test_int8_layer_without_a_padding_input_uses_multi_head_attention():
    """QAttention's mask input is [B, S, S]: a node without a padding mask gets the [1, 1, S, S] bias through
    MultiHeadAttention; the mask reads S from the kernel's input, not from k's head split."""
    model, consts = encoder_layer(int8=True, padded=False)
    fused, result = lower(model)
    assert ops(fused).count("MultiHeadAttention") == 1 and "QAttention" not in ops(fused)
    assert "Transpose" not in ops(fused)
    assert worst_error(fused, consts, 0, 0, padded=False, int8=True) < 1e-4
