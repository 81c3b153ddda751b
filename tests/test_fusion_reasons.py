"""fuse-attention says why it left an attention block alone, and --strict fails on it."""

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeattn.bundle.build import BuildConfig, build
from edgeattn.errors import StrictModeError
from edgeattn.passes import PassContext
from edgeattn.passes.fuse_attention import FuseAttention
from edgeattn.targets import resolve_target

H, D = 2, 8


def attention_graph(mask: str = "padding", rank: int = 4) -> onnx.ModelProto:
    """x [B, S, H*D] -> one attention block; the mask is the padding mask, an ALiBi-like bias, or none."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((H * D, H * D)).astype(np.float32) * 0.3, f"w{n}")
             for n in "qkv"]
    inits += [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
              [("split", [0, 0, H, D]), ("flat", [0, 0, H * D]), ("ax12", [1, 2]), ("merged", [-1, 0, D])]]
    inits.append(numpy_helper.from_array(np.array(D ** -0.5, np.float32), "scale"))
    nodes = []
    for n in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}_lin"]),
                  helper.make_node("Reshape", [f"{n}_lin", "split"], [f"{n}_4d"]),
                  helper.make_node("Transpose", [f"{n}_4d"], [n], perm=[0, 2, 1, 3] if n != "k" else [0, 2, 3, 1])]
    if rank == 3:  # heads folded into the batch: [B*H, S, D]
        for n in "qkv":
            nodes.append(helper.make_node("Reshape", [n, "merged"], [f"{n}3"]))
        q, kt, v = "q3", "k3", "v3"
    else:
        q, kt, v = "q", "k", "v"
    nodes += [helper.make_node("MatMul", [q, kt], ["s"]), helper.make_node("Mul", ["s", "scale"], ["scaled"])]
    if mask == "padding":  # (1 - mask) * -1e9, [B, 1, 1, S]
        inits += [numpy_helper.from_array(np.array(1.0, np.float32), "one"),
                  numpy_helper.from_array(np.array(-1e9, np.float32), "neg")]
        nodes += [helper.make_node("Cast", ["attention_mask"], ["mf"], to=TensorProto.FLOAT),
                  helper.make_node("Sub", ["one", "mf"], ["inv"]), helper.make_node("Mul", ["inv", "neg"], ["bias2"]),
                  helper.make_node("Unsqueeze", ["bias2", "ax12"], ["bias"])]
    elif mask == "alibi":  # -|i - j| * 0.5: a bias, not a mask
        nodes += [helper.make_node("Shape", ["x"], ["xs"], start=1, end=2),
                  helper.make_node("Squeeze", ["xs"], ["sl"]),
                  helper.make_node("Range", ["zero", "sl", "unit"], ["pos"]),
                  helper.make_node("Unsqueeze", ["pos", "ax_last"], ["pi"]),
                  helper.make_node("Sub", ["pi", "pos"], ["dist"]), helper.make_node("Abs", ["dist"], ["adist"]),
                  helper.make_node("Cast", ["adist"], ["fdist"], to=TensorProto.FLOAT),
                  helper.make_node("Mul", ["fdist", "half"], ["bias"])]
        inits += [numpy_helper.from_array(np.array(v, t), n) for n, v, t in
                  [("zero", 0, np.int64), ("unit", 1, np.int64), ("ax_last", [1], np.int64), ("half", -0.5, np.float32)]]
    nodes += [helper.make_node("Add", ["scaled", "bias"], ["masked"]) if mask != "none" else
              helper.make_node("Identity", ["scaled"], ["masked"]),
              helper.make_node("Softmax", ["masked"], ["p"], axis=-1), helper.make_node("MatMul", ["p", v], ["o"])]
    if rank == 3:
        nodes.append(helper.make_node("Reshape", ["o", "split2"], ["o4"]))
        inits.append(numpy_helper.from_array(np.array([-1, H, 0, D], np.int64), "split2"))
    nodes += [helper.make_node("Transpose", ["o4" if rank == 3 else "o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "flat"], ["y"])]
    graph = helper.make_graph(nodes, "attn", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", H * D]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", H * D])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def fuse(model: onnx.ModelProto):
    ir_model = ir.serde.deserialize_model(model)
    result = FuseAttention()(ir_model, PassContext(resolve_target("cpu")[0]))
    return result, ir.serde.serialize_model(ir_model)


def test_padding_mask_graph_is_fused_bidirectional_with_padding():
    result, fused = fuse(attention_graph("padding"))
    assert result.details["fused"] == 1 and result.problems == []
    node = next(n for n in fused.graph.node if n.domain == "edgeattn")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["causal"] == 0 and node.input[3:] == ["attention_window", "attention_mask"]
    assert abs(attrs["scale"] - D ** -0.5) < 1e-7


def test_bias_is_not_taken_for_a_mask():
    result, fused = fuse(attention_graph("alibi"))
    assert result.details["fused"] == 0
    assert "attention_window" not in [i.name for i in fused.graph.input]
    assert len(result.problems) == 1 and "ALiBi" in result.problems[0]
    assert result.details["unfused"][0]["reason"] in result.problems[0]


def test_three_d_attention_is_reported():
    result, _ = fuse(attention_graph("padding", rank=3))
    assert result.details["fused"] == 0
    assert "expected 4-D" in result.problems[0]


def test_strict_build_fails_on_unfused_attention(tmp_path):
    path = tmp_path / "alibi.onnx"
    onnx.save(attention_graph("alibi"), str(path))
    with pytest.raises(StrictModeError, match="ALiBi"):
        build(path, BuildConfig(target="cpu", out=tmp_path / "b", seq=(1, 8, 16), strict=True))
    bundle = build(path, BuildConfig(target="cpu", out=tmp_path / "b2", seq=(1, 8, 16)))
    assert any("ALiBi" in p for p in bundle.manifest.sections["problems"])
    assert bundle.manifest.input("window") is None


def test_float_window_input_is_rejected(tmp_path):
    model = attention_graph("padding")
    model.graph.input.append(helper.make_tensor_value_info("attention_window", TensorProto.FLOAT, []))
    with pytest.raises(Exception, match="attention_window.*int64"):
        fuse(model)


def sdpa_spelling(nan_fill: float = 0.0) -> onnx.ModelProto:
    """attention_graph as TorchScript writes scaled_dot_product_attention (opsets 14-17): Q and K^T each
    times sqrt(scale) before the MatMul, and Where(IsNaN(p), 0, p) after the softmax."""
    model = attention_graph("padding")
    nodes = list(model.graph.node)
    del model.graph.node[:]
    root = numpy_helper.from_array(np.array(D ** -0.25, np.float32), "root_scale")
    fill = numpy_helper.from_array(np.array(nan_fill, np.float32), "nan_fill")
    model.graph.initializer.extend([root, fill])
    for node in nodes:
        if node.op_type == "MatMul" and list(node.input) == ["q", "k"]:
            model.graph.node.extend([helper.make_node("Mul", ["q", "root_scale"], ["qs"]),
                                     helper.make_node("Mul", ["k", "root_scale"], ["ks"]),
                                     helper.make_node("MatMul", ["qs", "ks"], ["scaled"])])
        elif node.op_type == "Mul" and node.input[0] == "s":
            continue
        elif node.op_type == "MatMul" and node.input[0] == "p":
            model.graph.node.extend([helper.make_node("IsNaN", ["p"], ["nan"]),
                                     helper.make_node("Where", ["nan", "nan_fill", "p"], ["p0"]),
                                     helper.make_node("MatMul", ["p0", "v"], ["o"])])
        else:
            model.graph.node.append(node)
    onnx.checker.check_model(model)
    return model


def test_torchscript_sdpa_spelling_is_fused_with_the_product_of_both_scales():
    import onnxruntime as ort

    src = sdpa_spelling()
    result, fused = fuse(src)
    assert result.details["fused"] == 1 and result.problems == []
    node = next(n for n in fused.graph.node if n.domain == "edgeattn")
    assert abs(helper.get_attribute_value(node.attribute[[a.name for a in node.attribute].index("scale")])
               - D ** -0.5) < 1e-7
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 5, H * D)).astype(np.float32),
             "attention_mask": np.array([[1] * 5, [1, 1, 1, 0, 0]], np.int64), "attention_window": np.array(0)}
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(  # noqa: E731
        None, {i.name: feeds[i.name] for i in m.graph.input})[0]
    np.testing.assert_allclose(run(fused)[0], run(src)[0], atol=1e-5)
    np.testing.assert_allclose(run(fused)[1, :3], run(src)[1, :3], atol=1e-5)  # real rows of the padded one


def test_nan_guard_with_another_fill_is_reported():
    result, _ = fuse(sdpa_spelling(nan_fill=1.0))
    assert result.details["fused"] == 0
    assert "fill that is not 0" in result.details["unfused"][0]["reason"]
