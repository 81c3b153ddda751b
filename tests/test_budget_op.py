"""The attention budget in edgeattn::CachedWindowedAttention: the portable ONNX body (ONNX Runtime) and the
PyTorch form against the float64 oracle over streams past the ring's end (GQA, chunks, sinks, streams at
different positions), k = 0 bit for bit today's op, and the body reading only the chosen pages' rows."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.inliner
import onnx.numpy_helper
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from edgeattn.attention import DOMAIN
from edgeattn.attention.cached_function import BUDGET_INPUTS, CACHED_INPUTS, cached_function_proto, make_cached_node
from edgeattn.attention.cached_reference import cached_attention_np, page_bounds_np, write_ring
from onnx_fixtures import requires_torch

CHUNKS = [3, 1, 2, 1, 4, 1, 1, 1, 2, 1, 1, 3, 1, 1, 2, 1, 1, 1, 1, 3, 1, 1, 2, 1, 1]  # 38 tokens


def _model(sinks: int, budget: bool, dtype=TensorProto.FLOAT, pages_max: int = 0) -> onnx.ModelProto:
    i = TensorProto.INT64
    names = CACHED_INPUTS + (BUDGET_INPUTS if budget else ())
    ins = [helper.make_tensor_value_info(n, dtype, [f"{n}_{j}" for j in range(4)]) for n in CACHED_INPUTS[:6]]
    ins += [helper.make_tensor_value_info("cache_position", i, ["b"]), helper.make_tensor_value_info("window", i, [])]
    if budget:
        ins += [helper.make_tensor_value_info("pages", i, []),
                helper.make_tensor_value_info("key_bounds", dtype, ["b", "hkv", "p", 2, "d"])]
    graph = helper.make_graph([make_cached_node(list(names), out="out", sinks=sinks)], "g", ins,
                              [helper.make_tensor_value_info("out", dtype, ["b", "h", "s", "d"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    model.functions.append(cached_function_proto(18, budget=budget, pages_max=pages_max))
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _walk(rng, b, h, h_kv, d, sinks, wmax, chunks, dtype=np.float32, offsets=(0,)):
    """Yield (feeds, pos) over B streams (stream i starts offsets[i] tokens later), writing the ring after each
    chunk. Chunks are cut so every stream stays inside the ring's chunk limit."""
    pk = np.zeros((b, h_kv, sinks + wmax, d), dtype)
    pv = np.zeros_like(pk)
    pos = np.array([0] * b, np.int64)
    for s in (min(c, wmax) for c in chunks):
        feeds = dict(q=rng.standard_normal((b, h, s, d)).astype(dtype), q_sink=rng.standard_normal((b, h, s, d)).astype(dtype),
                     k=rng.standard_normal((b, h_kv, s, d)).astype(dtype), v=rng.standard_normal((b, h_kv, s, d)).astype(dtype),
                     past_key=pk, past_value=pv, cache_position=pos.copy())
        yield feeds, pos.copy()
        write_ring(pk, pv, feeds["k"], feeds["v"], pos, sinks)
        pos += s


@pytest.mark.parametrize("sinks, wmax, page, window, pages, heads",
                         [(2, 16, 4, 3, 2, (4, 2)), (0, 12, 4, 4, 1, (2, 2)), (4, 8, 2, 2, 3, (6, 2)),
                          (1, 16, 4, 0, 2, (4, 1)), (2, 8, 4, 1, 9, (4, 2))])
def test_body_matches_the_oracle(sinks, wmax, page, window, pages, heads):
    rng = np.random.default_rng(sinks * 100 + wmax + pages)
    old, new = _session(_model(sinks, False)), _session(_model(sinks, True))
    h, h_kv = heads
    for feeds, pos in _walk(rng, 2, h, h_kv, 8, sinks, wmax, CHUNKS):
        base = {**feeds, "window": np.array(window, np.int64)}
        bounds = page_bounds_np(feeds["past_key"], pos, sinks, page)
        got = new.run(None, {**base, "pages": np.array(pages, np.int64), "key_bounds": bounds})[0]
        want = cached_attention_np(*(feeds[x] for x in CACHED_INPUTS[:6]), pos, window, sinks=sinks, pages=pages,
                                   page=page, key_bounds=bounds)
        np.testing.assert_allclose(got, want, atol=2e-5)
        zero = new.run(None, {**base, "pages": np.array(0, np.int64), "key_bounds": bounds})[0]
        np.testing.assert_array_equal(zero, old.run(None, base)[0])  # k = 0: today's op, bit for bit


def test_streams_at_different_positions_share_a_batch():
    rng = np.random.default_rng(11)
    sinks, wmax, page, window = 2, 16, 4, 3
    sess = _session(_model(sinks, True))
    pk = rng.standard_normal((4, 2, sinks + wmax, 8)).astype(np.float32)
    pv = rng.standard_normal((4, 2, sinks + wmax, 8)).astype(np.float32)
    pos = np.array([0, 5, 17, 40], np.int64)
    feeds = dict(q=rng.standard_normal((4, 4, 2, 8)).astype(np.float32), k=rng.standard_normal((4, 2, 2, 8)).astype(np.float32),
                 v=rng.standard_normal((4, 2, 2, 8)).astype(np.float32), past_key=pk, past_value=pv, cache_position=pos)
    feeds["q_sink"] = rng.standard_normal(feeds["q"].shape).astype(np.float32)
    bounds = page_bounds_np(pk, pos, sinks, page)
    for pages in (1, 2, 4):
        got = sess.run(None, {**feeds, "window": np.array(window, np.int64), "pages": np.array(pages, np.int64),
                              "key_bounds": bounds})[0]
        want = cached_attention_np(*(feeds[x] for x in CACHED_INPUTS[:6]), pos, window, sinks=sinks, pages=pages,
                                   page=page, key_bounds=bounds)
        np.testing.assert_allclose(got, want, atol=2e-5)


def test_ties_choose_the_lower_page_in_the_body():
    """Pages 0 and 1 hold the same keys (equal bounds); their values differ."""
    sess = _session(_model(0, True))
    pk = np.zeros((1, 1, 12, 2), np.float32)
    pk[0, 0, :, 0] = np.tile([1.0, 0.5, 0.25, 0.0], 3)
    pv = np.zeros_like(pk)
    pv[0, 0, 0:4, 0], pv[0, 0, 4:8, 1] = 1.0, 1.0
    q = np.array([1.0, 0], np.float32).reshape(1, 1, 1, 2)
    zero = np.zeros((1, 1, 1, 2), np.float32)
    pos = np.array([12], np.int64)
    feeds = dict(q=q, q_sink=q, k=zero, v=zero, past_key=pk, past_value=pv, cache_position=pos,
                 window=np.array(4, np.int64), pages=np.array(1, np.int64), key_bounds=page_bounds_np(pk, pos, 0, 4))
    out = sess.run(None, feeds)[0][0, 0, 0]
    assert out[0] > 0 and out[1] == 0.0


@requires_torch
@pytest.mark.parametrize("sinks, wmax, page, window, pages", [(2, 16, 4, 3, 2), (0, 12, 4, 4, 1), (4, 8, 2, 2, 9)])
def test_torch_form_matches_the_oracle(sinks, wmax, page, window, pages):
    import torch

    from edgeattn.attention.cached_torch import cached_windowed_attention

    rng = np.random.default_rng(sinks + wmax)
    for feeds, pos in _walk(rng, 2, 4, 2, 8, sinks, wmax, CHUNKS, dtype=np.float64):
        bounds = page_bounds_np(feeds["past_key"], pos, sinks, page)
        ins = [torch.from_numpy(feeds[x]) for x in CACHED_INPUTS[:6]]
        got = cached_windowed_attention(*ins, torch.from_numpy(pos), torch.tensor(window), torch.tensor(pages),
                                        torch.from_numpy(bounds), sinks=sinks)
        want = cached_attention_np(*(feeds[x] for x in CACHED_INPUTS[:6]), pos, window, sinks=sinks, pages=pages,
                                   page=page, key_bounds=bounds)
        np.testing.assert_allclose(got.numpy(), want, atol=2e-5)
        no_pages = cached_windowed_attention(*ins, torch.from_numpy(pos), torch.tensor(window), sinks=sinks)
        zero = cached_windowed_attention(*ins, torch.from_numpy(pos), torch.tensor(window), torch.tensor(0),
                                         torch.from_numpy(bounds), sinks=sinks)
        np.testing.assert_array_equal(zero.numpy(), no_pages.numpy())


def test_the_body_reads_only_the_chosen_pages():
    """Every intermediate of the inlined body, run on a 1,027-row cache: none holds half as many values as the
    ring, but the free Reshapes of the cache that the row Gathers read."""
    sinks, wmax, page, d = 3, 1024, 16, 8
    model = _model(sinks, True)
    model.graph.node[0].attribute.append(helper.make_attribute("softcap", 0.0))  # the inliner takes no defaults
    model = onnx.inliner.inline_local_functions(model)
    producers = {out: node.op_type for node in model.graph.node for out in node.output}
    del model.graph.output[:]
    model.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in producers)
    rng = np.random.default_rng(0)
    pk = rng.standard_normal((1, 1, sinks + wmax, d)).astype(np.float32)
    pos = np.array([5000], np.int64)
    feeds = dict(q=rng.standard_normal((1, 2, 1, d)).astype(np.float32), k=rng.standard_normal((1, 1, 1, d)).astype(np.float32),
                 v=rng.standard_normal((1, 1, 1, d)).astype(np.float32), past_key=pk, past_value=pk, cache_position=pos,
                 window=np.array(32, np.int64), pages=np.array(2, np.int64), key_bounds=page_bounds_np(pk, pos, sinks, page))
    feeds["q_sink"] = feeds["q"]
    outs = _session(model).run(None, feeds)
    big = {name: producers[name] for name, x in zip(producers, outs) if np.asarray(x).size >= wmax * d // 2}
    assert set(big.values()) == {"Reshape"} and len(big) == 4, big  # past_key and past_value, for each Gather


def test_the_budget_inputs_do_not_keep_the_op_from_the_cpu_lowering():  # tests/test_budget_cpu_lowering.py lowers it
    import onnx_ir as ir

    from edgeattn.passes import PassContext
    from edgeattn.passes.cached_attention_cpu import LowerCachedAttentionForCpu
    from edgeattn.targets import get_target

    model = ir.serde.deserialize_model(_model(2, True))
    result = LowerCachedAttentionForCpu()(model, PassContext(get_target("cpu")))
    assert len(result.problems) == 1 and "expected static" in result.problems[0]  # this model's head counts are symbolic


def test_a_constant_k_max_with_a_mask_reads_what_a_run_time_k_reads():
    """The form for parsers that want TopK's k constant: k_max = 3, any k <= 3 at run time."""
    rng = np.random.default_rng(4)
    sinks, wmax, page, window = 2, 16, 4, 3
    sess = _session(_model(sinks, True, pages_max=3))
    for feeds, pos in _walk(rng, 2, 4, 2, 8, sinks, wmax, CHUNKS):
        bounds = page_bounds_np(feeds["past_key"], pos, sinks, page)
        for pages in (0, 1, 3):
            got = sess.run(None, {**feeds, "window": np.array(window, np.int64), "pages": np.array(pages, np.int64),
                                  "key_bounds": bounds})[0]
            want = cached_attention_np(*(feeds[x] for x in CACHED_INPUTS[:6]), pos, window, sinks=sinks,
                                       pages=pages, page=page, key_bounds=bounds)
            np.testing.assert_allclose(got, want, atol=2e-5)
    body = cached_function_proto(18, budget=True, pages_max=3).node
    (topk,) = [n for n in body if n.op_type == "TopK"]
    (k_node,) = [n for n in body if topk.input[1] in n.output]
    assert k_node.op_type == "Constant" and onnx.numpy_helper.to_array(k_node.attribute[0].t).tolist() == [3]
