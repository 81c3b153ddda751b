"""The CPU lowering of edgeattn::CachedWindowedAttention (edgeattn.passes.cached_attention_cpu): plain ops
reading one shared ring geometry, against the float64 oracle chunk by chunk, on streams at different
positions in one batch, and in a real decoder bundle against the op's own body."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from edgeattn.attention import DOMAIN
from edgeattn.attention.cached_function import CACHED_OP_TYPE, cached_function_proto, make_cached_node
from edgeattn.attention.cached_reference import cached_attention_np, write_ring
from edgeattn.passes import PassContext
from edgeattn.passes.cached_attention_cpu import LowerCachedAttentionForCpu
from edgeattn.targets import get_target

H, HKV, D = 4, 2, 8
CHUNKS = [3, 1, 1, 5, 1, 2, 4, 1, 1, 1, 3]


def _two_layer_model(sinks: int, dtype=TensorProto.FLOAT) -> onnx.ModelProto:
    """Two op nodes reading the same position and window inputs, each with its own q/k/v and cache."""
    f, i = dtype, TensorProto.INT64
    ins, nodes, outs = [], [], []
    for layer in range(2):
        names = [f"{x}{layer}" for x in ("q", "q_sink", "k", "v", "past_key", "past_value")]
        ins += [helper.make_tensor_value_info(names[0], f, ["b", H, "s", D]),
                helper.make_tensor_value_info(names[1], f, ["b", H, "s", D]),
                helper.make_tensor_value_info(names[2], f, ["b", HKV, "s", D]),
                helper.make_tensor_value_info(names[3], f, ["b", HKV, "s", D]),
                helper.make_tensor_value_info(names[4], f, ["b", HKV, "cache", D]),
                helper.make_tensor_value_info(names[5], f, ["b", HKV, "cache", D])]
        nodes.append(make_cached_node(names + ["cache_position", "window"], out=f"out{layer}", sinks=sinks,
                                      name=f"attn{layer}"))
        outs.append(helper.make_tensor_value_info(f"out{layer}", f, ["b", H, "s", D]))
    ins += [helper.make_tensor_value_info("cache_position", i, ["b"]), helper.make_tensor_value_info("window", i, [])]
    model = helper.make_model(helper.make_graph(nodes, "g", ins, outs),
                              opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    model.functions.append(cached_function_proto(18))
    model.ir_version = 9
    return model


def _lowered(model: onnx.ModelProto):
    m = ir.serde.deserialize_model(model)
    result = LowerCachedAttentionForCpu()(m, PassContext(get_target("cpu")))
    return ir.serde.serialize_model(m), result


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("sinks, wmax, window", [(2, 6, 0), (2, 6, 3), (0, 5, 0), (4, 8, 5), (1, 3, 2), (4, 40, 0)])
def test_lowered_layers_match_the_reference_chunk_by_chunk(sinks, wmax, window):
    lowered, result = _lowered(_two_layer_model(sinks))
    assert result.details["lowered"] == 2 and result.details["geometries"] == 1 and not result.problems
    assert not any(n.op_type == CACHED_OP_TYPE for n in lowered.graph.node)
    sess = _session(lowered)
    rng = np.random.default_rng(sinks * 100 + wmax)
    b, t = 2, sum(CHUNKS)
    data = {layer: [rng.standard_normal((b, hh, t, D)).astype(np.float32) for hh in (H, H, HKV, HKV)]
            for layer in range(2)}
    caches = {layer: [np.zeros((b, HKV, sinks + wmax, D), np.float32) for _ in range(2)] for layer in range(2)}
    n = 0
    for s in (min(c, wmax) for c in CHUNKS):
        pos = np.array([n] * b, np.int64)
        feeds = {"cache_position": pos, "window": np.array(window, np.int64)}
        for layer in range(2):
            q, qs, k, v = (x[:, :, n:n + s] for x in data[layer])
            feeds.update({f"q{layer}": q, f"q_sink{layer}": qs * 0.5, f"k{layer}": k, f"v{layer}": v,
                          f"past_key{layer}": caches[layer][0], f"past_value{layer}": caches[layer][1]})
        got = sess.run(None, feeds)
        for layer in range(2):
            ins = [feeds[f"{x}{layer}"] for x in ("q", "q_sink", "k", "v", "past_key", "past_value")]
            want = cached_attention_np(*ins, pos, window, sinks=sinks)
            np.testing.assert_allclose(got[layer], want, atol=1e-5)
            write_ring(*caches[layer], ins[2], ins[3], pos, sinks)
        n += s


def test_streams_at_different_positions_share_a_batch():
    sinks, wmax = 2, 6
    lowered, _ = _lowered(_two_layer_model(sinks))
    sess = _session(lowered)
    rng = np.random.default_rng(3)
    pos = np.array([0, 5, 17], np.int64)
    feeds = {"cache_position": pos}
    for layer in range(2):
        feeds.update({f"q{layer}": rng.standard_normal((3, H, 1, D)), f"q_sink{layer}": rng.standard_normal((3, H, 1, D)),
                      f"k{layer}": rng.standard_normal((3, HKV, 1, D)), f"v{layer}": rng.standard_normal((3, HKV, 1, D)),
                      f"past_key{layer}": rng.standard_normal((3, HKV, sinks + wmax, D)),
                      f"past_value{layer}": rng.standard_normal((3, HKV, sinks + wmax, D))})
    feeds = {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in feeds.items()}
    for window in (0, 3):
        got = sess.run(None, {**feeds, "window": np.array(window, np.int64)})
        for layer in range(2):
            ins = [feeds[f"{x}{layer}"] for x in ("q", "q_sink", "k", "v", "past_key", "past_value")]
            np.testing.assert_allclose(got[layer], cached_attention_np(*ins, pos, window, sinks=sinks), atol=1e-5)


def test_a_node_it_cannot_take_keeps_the_op_and_says_why():
    _, result = _lowered(_two_layer_model(2, dtype=TensorProto.FLOAT16))
    assert result.details["lowered"] == 0 and len(result.problems) == 2
    assert "float32" in result.problems[0] and "kept as the op" in result.problems[0]


def test_the_fused_form_says_why_it_lowers_to_plain_ops():
    """q and k are graph inputs here, not rotations GroupQueryAttention could take over."""
    m = ir.serde.deserialize_model(_two_layer_model(2))
    result = LowerCachedAttentionForCpu()(m, PassContext(get_target("cpu"), cached_attention="fused"))
    assert result.details["lowered"] == 2 and result.details["group_query_attention"] == 0
    assert len(result.problems) == 2 and all(
        "not GroupQueryAttention: the query or key is not a half-rotation RotaryEmbedding" in p for p in result.problems)


def test_other_backends_keep_the_op():
    m = ir.serde.deserialize_model(_two_layer_model(2))
    results = _plan_run(m, "rtx", LowerCachedAttentionForCpu.name)  # not in TensorRT's plan: the plugin takes the op
    assert not any(r.changed for r in results) and sum(n.op_type == CACHED_OP_TYPE for n in m.graph) == 2


def _plan_run(model, target, name):
    """Run pass `name` the way a build for `target` does: only if the target's build plan holds it."""
    from edgeattn.passes.plans import plan_for

    plan = plan_for(get_target(target).backend)
    return plan.only(tuple(p for p in plan.passes if p == name)).run(model, PassContext(get_target(target)))
