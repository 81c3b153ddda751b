"""The CPU lowering of a cached attention node with the attention budget's inputs (pages, key_bounds): the chosen
pages' rows in the same Softmax as the sink, window and chunk keys, one shared geometry for every layer, against
the float64 oracle and the op's own body over streams past the ring's end, k = 0 as the window alone, and no
tensor the size of the ring in the lowered graph."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from edgeattn.attention import DOMAIN
from edgeattn.attention.cached_function import CACHED_OP_TYPE, cached_function_proto, make_cached_node
from edgeattn.attention.cached_reference import cached_attention_np, page_bounds_np, write_ring
from edgeattn.passes import PassContext
from edgeattn.passes.cached_attention_cpu import LowerCachedAttentionForCpu
from edgeattn.targets import get_target

D = 8
CHUNKS = [3, 1, 2, 1, 4, 1, 1, 1, 2, 1, 1, 3, 1, 1, 2, 1, 1, 1, 1, 3, 1, 1, 2, 1, 1]  # 38 tokens
NAMES = ("q", "q_sink", "k", "v", "past_key", "past_value")


def _model(sinks: int, h: int, hkv: int, budget: bool = True, layers: int = 2) -> onnx.ModelProto:
    """`layers` op nodes reading the same position, window and pages inputs, each with its own q/k/v, cache
    and bounds."""
    f, i = TensorProto.FLOAT, TensorProto.INT64
    ins, nodes, outs = [], [], []
    for layer in range(layers):
        names = [f"{x}{layer}" for x in NAMES]
        ins += [helper.make_tensor_value_info(names[0], f, ["b", h, "s", D]),
                helper.make_tensor_value_info(names[1], f, ["b", h, "s", D]),
                helper.make_tensor_value_info(names[2], f, ["b", hkv, "s", D]),
                helper.make_tensor_value_info(names[3], f, ["b", hkv, "s", D]),
                helper.make_tensor_value_info(names[4], f, ["b", hkv, "cache", D]),
                helper.make_tensor_value_info(names[5], f, ["b", hkv, "cache", D])]
        extra = []
        if budget:
            ins.append(helper.make_tensor_value_info(f"key_bounds{layer}", f, ["b", hkv, "p", 2, D]))
            extra = ["pages", f"key_bounds{layer}"]
        nodes.append(make_cached_node(names + ["cache_position", "window"] + extra, out=f"out{layer}", sinks=sinks,
                                      name=f"attn{layer}"))
        outs.append(helper.make_tensor_value_info(f"out{layer}", f, ["b", h, "s", D]))
    ins += [helper.make_tensor_value_info("cache_position", i, ["b"]), helper.make_tensor_value_info("window", i, [])]
    if budget:
        ins.append(helper.make_tensor_value_info("pages", i, []))
    model = helper.make_model(helper.make_graph(nodes, "g", ins, outs),
                              opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    model.functions.append(cached_function_proto(18, budget=budget))
    model.ir_version = 9
    return model


def _lowered(model: onnx.ModelProto, form: str = "ops"):
    m = ir.serde.deserialize_model(model)
    result = LowerCachedAttentionForCpu()(m, PassContext(get_target("cpu"), cached_attention=form))
    return ir.serde.serialize_model(m), result


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("sinks, wmax, page, window, pages, heads",
                         [(2, 16, 4, 3, 2, (4, 2)), (0, 12, 4, 4, 1, (2, 2)), (4, 8, 2, 2, 3, (6, 2)),
                          (1, 16, 4, 0, 2, (4, 1)), (2, 8, 4, 1, 9, (4, 2))])
def test_lowered_budget_matches_the_oracle_and_the_body(sinks, wmax, page, window, pages, heads):
    h, hkv = heads
    model = _model(sinks, h, hkv)
    lowered, result = _lowered(model)
    assert result.details["lowered"] == 2 and result.details["geometries"] == 1 and not result.problems
    assert not any(n.op_type == CACHED_OP_TYPE for n in lowered.graph.node)
    assert sum(n.op_type == "TopK" for n in lowered.graph.node) == 2  # one a layer; the candidates once
    sess, body = _session(lowered), _session(model)
    window_only = _session(_lowered(_model(sinks, h, hkv, budget=False))[0])
    rng = np.random.default_rng(sinks * 100 + wmax + pages)
    b, t = 2, sum(CHUNKS)
    data = {layer: [rng.standard_normal((b, hh, t, D)).astype(np.float32) for hh in (h, h, hkv, hkv)]
            for layer in range(2)}
    caches = {layer: [np.zeros((b, hkv, sinks + wmax, D), np.float32) for _ in range(2)] for layer in range(2)}
    n = 0
    for s in (min(c, wmax) for c in CHUNKS):
        pos = np.array([n, n + 3] if n + 3 + s <= t else [n, n], np.int64)  # two streams at different positions
        feeds = {"cache_position": pos, "window": np.array(window, np.int64)}
        for layer in range(2):
            q, qs, k, v = (x[:, :, n:n + s] for x in data[layer])
            feeds.update({f"q{layer}": q, f"q_sink{layer}": qs * 0.5, f"k{layer}": k, f"v{layer}": v,
                          f"past_key{layer}": caches[layer][0], f"past_value{layer}": caches[layer][1],
                          f"key_bounds{layer}": page_bounds_np(caches[layer][0], pos, sinks, page)})
        got = sess.run(None, {**feeds, "pages": np.array(pages, np.int64)})
        from_body = body.run(None, {**feeds, "pages": np.array(pages, np.int64)})
        zero = sess.run(None, {**feeds, "pages": np.array(0, np.int64)})
        alone = window_only.run(None, {k: x for k, x in feeds.items() if not k.startswith("key_bounds")})
        for layer in range(2):
            ins = [feeds[f"{x}{layer}"] for x in NAMES]
            want = cached_attention_np(*ins, pos, window, sinks=sinks, pages=pages, page=page,
                                       key_bounds=feeds[f"key_bounds{layer}"])
            np.testing.assert_allclose(got[layer], want, atol=2e-5)
            np.testing.assert_allclose(got[layer], from_body[layer], atol=2e-6)
            np.testing.assert_allclose(zero[layer], alone[layer], atol=1e-6)  # k = 0: the window alone
            write_ring(*caches[layer], ins[2], ins[3], pos, sinks)
        n += s


def test_ties_choose_the_lower_page():
    """Pages 0 and 1 hold the same keys (equal bounds); their values differ: page 0's are read."""
    lowered, _ = _lowered(_model(0, 1, 1, layers=1))
    pk = np.zeros((1, 1, 12, D), np.float32)
    pk[0, 0, :, 0] = np.tile([1.0, 0.5, 0.25, 0.0], 3)
    pv = np.zeros_like(pk)
    pv[0, 0, 0:4, 0], pv[0, 0, 4:8, 1] = 1.0, 1.0
    q = np.zeros((1, 1, 1, D), np.float32)
    q[..., 0] = 1.0
    zero = np.zeros((1, 1, 1, D), np.float32)
    pos = np.array([12], np.int64)
    feeds = dict(q0=q, q_sink0=q, k0=zero, v0=zero, past_key0=pk, past_value0=pv, cache_position=pos,
                 window=np.array(4, np.int64), pages=np.array(1, np.int64), key_bounds0=page_bounds_np(pk, pos, 0, 4))
    out = _session(lowered).run(None, feeds)[0][0, 0, 0]
    assert out[0] > 0 and out[1] == 0.0


def test_no_tensor_the_size_of_the_ring():
    """Every intermediate of the lowered graph at a decode step of a 4,100-row ring past its end: none holds as
    many values a stream as the ring has rows, but the free Reshapes of the graph's inputs (the cache seen as
    rows for the Gathers, the bounds as one row a page for the page scores)."""
    sinks, wmax, page, window, pages = 4, 4096, 16, 32, 3
    model, _ = _lowered(_model(sinks, 4, 2))
    inputs = {i.name for i in model.graph.input}
    producers = {out: node for node in model.graph.node for out in node.output}
    del model.graph.output[:]
    model.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in producers)
    b, c = 2, sinks + wmax
    outs = _session(model).run(None, _step_feeds(np.array([9000, 5000], np.int64), c, window, pages, sinks, page))
    big = {name: producers[name] for name, x in zip(producers, outs) if np.asarray(x).size >= b * c}
    views = {name for name, node in big.items() if node.op_type == "Reshape" and node.input[0] in inputs}
    assert len(views) == 6 and not set(big) - views, sorted(big)  # past_key, past_value and key_bounds, each layer


def _step_feeds(pos, c: int, window: int, pages: int, sinks: int, page: int) -> dict:
    """A decode step's feeds for _model(2, 4, 2, budget=True): 2 streams at `pos`, a cache of c rows per layer
    (keys = values), their page bounds."""
    rng, b = np.random.default_rng(0), len(pos)
    feeds = {"cache_position": pos, "window": np.array(window, np.int64), "pages": np.array(pages, np.int64)}
    for layer in range(2):
        pk = rng.standard_normal((b, 2, c, D)).astype(np.float32)
        feeds.update({f"q{layer}": rng.standard_normal((b, 4, 1, D)).astype(np.float32),
                      f"q_sink{layer}": rng.standard_normal((b, 4, 1, D)).astype(np.float32),
                      f"k{layer}": rng.standard_normal((b, 2, 1, D)).astype(np.float32),
                      f"v{layer}": rng.standard_normal((b, 2, 1, D)).astype(np.float32),
                      f"past_key{layer}": pk, f"past_value{layer}": pk,
                      f"key_bounds{layer}": page_bounds_np(pk, pos, sinks, page)})
    return feeds


def test_the_fused_form_lowers_a_budget_node_to_plain_ops_and_says_why():
    _, result = _lowered(_model(2, 4, 2), form="fused")
    assert result.details["lowered"] == 2 and result.details["group_query_attention"] == 0
    assert not result.details["kept"]


PAGE_NODES = 24  # a layer's page path in the lowered graph (~44 before its layout was planned for ONNX Runtime)
ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Mod", "Min", "Max", "Relu", "Where", "Less", "Greater", "LessOrEqual",
               "GreaterOrEqual", "And", "Or", "Sum"}


def test_the_page_path_is_few_nodes_on_long_rows():
    """A CPU decode step is thousands of small nodes, each ~10 us in ONNX Runtime whatever its work: a layer's pages
    add at most PAGE_NODES nodes (the layers' own part; what positions and shapes alone give is built once a step),
    none a Transpose, Unsqueeze or Expand; and no elementwise node of a layer writes a tensor whose last axis is 1
    (ONNX Runtime's broadcasting loops that axis element by element, ~10x slower)."""
    def nodes(model):
        return [n for n in model.graph.node if n.name.startswith("attn1/")]  # the second layer: per-layer nodes only

    per_layer = {budget: nodes(_lowered(_model(2, 4, 2, budget=budget))[0]) for budget in (False, True)}
    added = len(per_layer[True]) - len(per_layer[False])
    assert added <= PAGE_NODES, f"the page path takes {added} nodes a layer (at most {PAGE_NODES})"
    kinds = {n.op_type for n in per_layer[True]} - {n.op_type for n in per_layer[False]}
    assert not kinds & {"Transpose", "Unsqueeze", "Expand"}, kinds

    model, _ = _lowered(_model(2, 4, 2))
    elementwise = {n.output[0]: n.name for n in nodes(model) if n.op_type in ELEMENTWISE}
    del model.graph.output[:]
    model.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in elementwise)
    outs = _session(model).run(None, _step_feeds(np.array([40, 23], np.int64), 2 + 16, 3, 2, sinks=2, page=4))
    column = [name for name, x in zip(elementwise.values(), outs) if x.ndim and x.shape[-1] == 1]
    assert not column, column
