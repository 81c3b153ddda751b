"""The attention-body build pass: which body it picks, and the cpu lowering against the float64 reference."""

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from edgeattn.attention.onnx_node import attach_function, make_node
from edgeattn.attention.reference import windowed_attention_np
from edgeattn.passes import PassContext
from edgeattn.passes.attention_body import AttentionBody, choose
from edgeattn.targets import get_target


def two_layers(causal: int, sinks: int, h: int, h_kv: int, s_q: int, s_k: int, d: int = 8) -> onnx.ModelProto:
    """Two WindowedAttention nodes sharing the window and padding mask (like the layers of one model)."""
    inputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, ["b", h, s_q, d]),
              helper.make_tensor_value_info("k", TensorProto.FLOAT, ["b", h_kv, s_k, d]),
              helper.make_tensor_value_info("v", TensorProto.FLOAT, ["b", h_kv, s_k, d]),
              helper.make_tensor_value_info("window", TensorProto.INT64, []),
              helper.make_tensor_value_info("pad", TensorProto.BOOL, ["b", s_k])]
    nodes = [make_node("q", "k", "v", "window", "pad", out="o1", causal=causal, sinks=sinks),
             helper.make_node("Add", ["o1", "q"], ["q2"]),
             make_node("q2", "k", "v", "window", "pad", out="out", causal=causal, sinks=sinks, scale=0.25)]
    nodes[0].name, nodes[2].name = "attn0", "attn1"
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["b", h, s_q, d])
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, [out]), opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    attach_function(model)
    return model


def reference(feeds, causal, sinks):
    q, k, v, w, pad = (feeds[n] for n in ("q", "k", "v", "window", "pad"))
    o1 = windowed_attention_np(q, k, v, int(w), sinks=sinks, causal=bool(causal), key_padding_mask=pad)
    return windowed_attention_np(o1 + q, k, v, int(w), sinks=sinks, causal=bool(causal), key_padding_mask=pad,
                                 scale=0.25)


@pytest.mark.parametrize("causal,sinks,h,h_kv,s_q,s_k", [(1, 0, 4, 4, 9, 9), (1, 2, 4, 2, 9, 9), (0, 0, 2, 1, 7, 7),
                                                        (1, 1, 4, 2, 3, 11)])
def test_cpu_lowering_matches_the_reference(causal, sinks, h, h_kv, s_q, s_k):
    src = two_layers(causal, sinks, h, h_kv, s_q, s_k)
    model = ir.serde.deserialize_model(src)
    result = AttentionBody()(model, PassContext(get_target("cpu"), seq=(1, 16, 64)))
    assert result.details["body"] == "dense" and result.details["lowered"] == 2 and not result.details["kept"]
    lowered = ir.serde.serialize_model(model)
    assert not any(n.domain == "edgeattn" for n in lowered.graph.node) and not lowered.functions
    assert sum(n.op_type == "Range" for n in lowered.graph.node) == 1  # one mask for both layers
    sess = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(causal + sinks + h)
    worst = 0.0
    for window in (0, 1, 3, s_k + 2):
        feeds = {"q": rng.standard_normal((2, h, s_q, 8)).astype(np.float32),
                 "k": rng.standard_normal((2, h_kv, s_k, 8)).astype(np.float32),
                 "v": rng.standard_normal((2, h_kv, s_k, 8)).astype(np.float32),
                 "window": np.array(window, np.int64), "pad": rng.random((2, s_k)) > 0.3}
        feeds["pad"][1] = False  # a fully padded sequence: zeros, not NaN
        got = sess.run(None, feeds)[0]
        worst = max(worst, float(np.abs(got - reference(feeds, causal, sinks)).max()))
    assert worst < 1e-5


def test_choice_of_body():
    assert choose("onnxruntime", 512)[0] == "dense"
    assert choose("onnxruntime", 4096)[0] == "blocked"
    assert choose("tensorrt", 128)[0] == "blocked"
    assert choose("tensorrt_rtx", 4096, "dense") == ("dense", "asked for dense")


def test_long_sequences_keep_the_blocked_body():
    model = ir.serde.deserialize_model(two_layers(1, 0, 2, 2, 5, 5))
    result = AttentionBody()(model, PassContext(get_target("cpu"), seq=(1, 128, 8192)))
    assert result.details["body"] == "blocked" and not result.changed
    assert sum(n.domain == "edgeattn" for n in model.graph) == 2
