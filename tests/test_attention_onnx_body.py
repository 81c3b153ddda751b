"""The portable ONNX body of edgeattn::WindowedAttention, run by ONNX Runtime, against the float64 reference."""

import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from edgeattn.attention import DOMAIN, OP_TYPE
from edgeattn.attention.onnx_function import BLOCK_K, BLOCK_Q, function_proto
from edgeattn.attention.onnx_node import attach_function, make_node
from edgeattn.attention.reference import windowed_attention_np
from edgeattn.errors import ConfigError, ModelError


def layer(causal: int, sinks: int, mask: bool, opset: int = 18, body: str = "blocked") -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", f"h_{n}", f"s_{n}", "d"]) for n in "qkv"]
    inputs.append(helper.make_tensor_value_info("window", TensorProto.INT64, []))
    if mask:
        inputs.append(helper.make_tensor_value_info("pad", TensorProto.BOOL, ["b", "s_k"]))
    node = make_node("q", "k", "v", "window", "pad" if mask else None, out="out", causal=causal, sinks=sinks)
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["b", "h_q", "s_q", "d"])
    model = helper.make_model(helper.make_graph([node], "layer", inputs, [out]),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10  # what ONNX Runtime 1.30 (the H200 image) still loads; onnx's default is newer
    attach_function(model, body)
    onnx.checker.check_model(model, full_check=True)
    return model


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


# (B, H, H_kv, S_q, S_k): lengths that are and are not multiples of the blocks, GQA, decode (S_q < S_k)
SHAPES = [(1, 2, 2, 5, 5), (2, 4, 2, BLOCK_Q + 3, BLOCK_Q + 3), (1, 3, 1, 2 * BLOCK_K + 1, 2 * BLOCK_K + 1),
          (1, 2, 1, 1, 3 * BLOCK_K - 7), (2, 2, 2, 9, BLOCK_K + 40)]


BODIES = ("blocked", "dense")


@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize("causal,sinks,mask", list(itertools.product((1, 0), (0, 4), (False, True))))
def test_body_matches_reference(causal, sinks, mask, body):
    sess = session(layer(causal, sinks, mask, body=body))
    rng = np.random.default_rng(causal * 10 + sinks + mask)
    worst = 0.0
    for b, h, h_kv, s_q, s_k in SHAPES:
        q = rng.standard_normal((b, h, s_q, 16)).astype(np.float32)
        k, v = (rng.standard_normal((b, h_kv, s_k, 16)).astype(np.float32) for _ in range(2))
        pad = None
        if mask:
            pad = rng.random((b, s_k)) > 0.3
            pad[-1, :] = False if b > 1 else pad[-1, :]  # a fully padded sequence -> zeros
        for window in sorted({1, 3, 17, s_k - 1, s_k, s_k + 9, 0} - {-1}):
            feeds = {"q": q, "k": k, "v": v, "window": np.array(window, np.int64)}
            if mask:
                feeds["pad"] = pad
            got = sess.run(None, feeds)[0]
            want = windowed_attention_np(q, k, v, window, sinks=sinks, causal=bool(causal), key_padding_mask=pad)
            assert got.shape == want.shape
            worst = max(worst, float(np.abs(got - want).max()))
    assert worst <= 1e-5


@pytest.mark.parametrize("body", BODIES)
def test_fully_padded_rows_are_zero_not_nan(body):
    sess = session(layer(1, 0, True, body=body))
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 1, 6, 8)).astype(np.float32) for _ in range(3))
    out = sess.run(None, {"q": q, "k": k, "v": v, "window": np.array(2, np.int64), "pad": np.zeros((1, 6), bool)})[0]
    assert np.array_equal(out, np.zeros_like(out))


@pytest.mark.parametrize("body", BODIES)
def test_negative_window_runs_as_full(body):
    sess = session(layer(1, 0, False, body=body))
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 2, 7, 8)).astype(np.float32) for _ in range(3))
    run = lambda w: sess.run(None, {"q": q, "k": k, "v": v, "window": np.array(w, np.int64)})[0]  # noqa: E731
    np.testing.assert_array_equal(run(-5), run(0))


def test_float_window_is_rejected_at_run_time():
    sess = session(layer(1, 0, False))
    x = np.zeros((1, 1, 4, 8), np.float32)
    with pytest.raises(Exception, match="(?i)type|tensor\\(float\\)"):
        sess.run(None, {"q": x, "k": x, "v": x, "window": np.array(2.0, np.float32)})


@pytest.mark.parametrize("body", BODIES)
def test_fp16_inputs_keep_their_type(body):
    model = layer(0, 0, False, body=body)
    for value in list(model.graph.input)[:3] + list(model.graph.output):
        value.type.tensor_type.elem_type = TensorProto.FLOAT16
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 2, 9, 8)).astype(np.float16) for _ in range(3))
    got = session(model).run(None, {"q": q, "k": k, "v": v, "window": np.array(3, np.int64)})[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, windowed_attention_np(q, k, v, 3, causal=False), atol=2e-3)


def test_plugin_form_of_the_node():
    node = make_node("q", "k", "v", "w", "m", out="o", causal=0, sinks=4, scale=0.5)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert (node.op_type, node.domain, list(node.input)) == (OP_TYPE, DOMAIN, ["q", "k", "v", "w", "m"])
    assert attrs == {"causal": 0, "sinks": 4, "scale": 0.5, "plugin_namespace": b"edgeattn"}


def test_function_is_block_local():
    """No op in the body sees the whole [S_q, S_k] score matrix: keys are gathered per query block."""
    fn = function_proto(18)
    ops = [n.op_type for n in fn.node]
    assert (fn.domain, fn.name) == (DOMAIN, OP_TYPE)
    assert ops.count("Gather") >= 2 and "Range" in ops and ops.count("MatMul") == 4
    assert {a.name for a in fn.attribute_proto} == {"causal", "sinks", "scale", "plugin_namespace"}


def test_dense_body_is_small_and_has_one_score_gemm():
    dense, blocked = function_proto(18, "dense"), function_proto(18)
    ops = [n.op_type for n in dense.node]
    assert ops.count("MatMul") == 2 and ops.count("Softmax") == 1 and "Gather" not in ops
    assert len(dense.node) * 2 < len(blocked.node)
    with pytest.raises(ValueError, match="body"):
        function_proto(18, "sparse")


@pytest.mark.parametrize("kwargs", [{"causal": 2}, {"sinks": -1}, {"scale": -1.0}])
def test_bad_attributes(kwargs):
    with pytest.raises(ConfigError):
        make_node("q", "k", "v", "w", out="o", **kwargs)


def test_body_needs_opset_18():
    with pytest.raises(ModelError, match="opset >= 18"):
        layer(1, 0, False, opset=17)


@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize("k_shape,v_shape,rule", [
    ((1, 2, 5, 8), (1, 2, 6, 8), "expected v of k's shape"),
    ((1, 3, 5, 8), (1, 3, 5, 8), "H a multiple of k's H_kv"),
    ((1, 2, 5, 4), (1, 2, 5, 4), "with q's B and D"),
])
def test_disagreeing_shapes_fail_with_the_rule_at_run_time(k_shape, v_shape, rule, body):
    sess = session(layer(1, 0, False, body=body))
    q = np.zeros((1, 2, 5, 8), np.float32)
    feeds = {"q": q, "k": np.zeros(k_shape, np.float32), "v": np.zeros(v_shape, np.float32), "window": np.array(2)}
    with pytest.raises(Exception, match=rule.replace("'", ".")):
        sess.run(None, feeds)
