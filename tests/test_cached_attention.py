"""edgeattn::CachedWindowedAttention: its ONNX body (ONNX Runtime) and its PyTorch form against the float64
reference, chunk by chunk, and a whole stream against the uncached op."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from edgeattn.attention import DOMAIN
from edgeattn.attention.cached_function import CACHED_INPUTS, cached_function_proto, make_cached_node
from edgeattn.attention.cached_reference import cached_attention_np, write_ring
from edgeattn.attention.reference import windowed_attention_np
from edgeattn.attention.ring import RingLayout
from onnx_fixtures import requires_torch

CHUNKS = [3, 1, 1, 5, 1, 2, 4, 1, 1, 1, 3]  # 23 tokens: prefill chunks and decode steps


def _session(sinks: int) -> ort.InferenceSession:
    f, i = TensorProto.FLOAT, TensorProto.INT64
    ins = [helper.make_tensor_value_info(n, f, ["b", "h", "s", "d"]) for n in CACHED_INPUTS[:6]]
    ins += [helper.make_tensor_value_info("cache_position", i, ["b"]), helper.make_tensor_value_info("window", i, [])]
    graph = helper.make_graph([make_cached_node(list(CACHED_INPUTS), out="out", sinks=sinks)], "g", ins,
                              [helper.make_tensor_value_info("out", f, ["b", "h", "s", "d"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    model.functions.append(cached_function_proto(18))
    model.ir_version = 9
    onnx.checker.check_model(model)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("sinks, wmax, window", [(2, 6, 0), (2, 6, 3), (0, 5, 0), (4, 8, 5), (1, 3, 2), (4, 40, 0)])
def test_onnx_body_matches_the_reference_and_the_stream_matches_the_uncached_op(sinks, wmax, window):
    rng = np.random.default_rng(sinks * 100 + wmax)
    sess = _session(sinks)
    b, h, h_kv, d = 2, 4, 2, 8
    q = rng.standard_normal((b, h, sum(CHUNKS), d)).astype(np.float32)
    k = rng.standard_normal((b, h_kv, sum(CHUNKS), d)).astype(np.float32)
    v = rng.standard_normal((b, h_kv, sum(CHUNKS), d)).astype(np.float32)
    pk = np.zeros((b, h_kv, sinks + wmax, d), np.float32)
    pv = np.zeros_like(pk)
    outs, n = [], 0
    for s in (min(c, wmax) for c in CHUNKS):
        pos = np.array([n] * b, np.int64)
        feeds = dict(q=q[:, :, n:n + s], q_sink=q[:, :, n:n + s], k=k[:, :, n:n + s], v=v[:, :, n:n + s],
                     past_key=pk, past_value=pv, cache_position=pos, window=np.array(window, np.int64))
        got = sess.run(None, feeds)[0]
        want = cached_attention_np(*(feeds[x] for x in CACHED_INPUTS[:6]), pos, window, sinks=sinks)
        np.testing.assert_allclose(got, want, atol=1e-5)
        outs.append(got)
        write_ring(pk, pv, feeds["k"], feeds["v"], pos, sinks)
        n += s
    stream = windowed_attention_np(q[:, :, :n], k[:, :, :n], v[:, :, :n], window or wmax, sinks=sinks, causal=True)
    np.testing.assert_allclose(np.concatenate(outs, axis=2), stream, atol=1e-5)


def test_streams_at_different_positions_share_a_batch():
    """Continuous batching: each row of B reads its own ring at its own position."""
    rng = np.random.default_rng(3)
    sinks, wmax, d = 2, 6, 8
    sess = _session(sinks)
    pk = rng.standard_normal((3, 2, sinks + wmax, d)).astype(np.float32)
    pv = rng.standard_normal((3, 2, sinks + wmax, d)).astype(np.float32)
    pos = np.array([0, 5, 17], np.int64)
    feeds = dict(q=rng.standard_normal((3, 4, 1, d)).astype(np.float32), k=rng.standard_normal((3, 2, 1, d)).astype(np.float32),
                 v=rng.standard_normal((3, 2, 1, d)).astype(np.float32), past_key=pk, past_value=pv, cache_position=pos)
    feeds["q_sink"] = rng.standard_normal(feeds["q"].shape).astype(np.float32)
    for window in (0, 3):
        got = sess.run(None, {**feeds, "window": np.array(window, np.int64)})[0]
        want = cached_attention_np(*(feeds[x] for x in CACHED_INPUTS[:6]), pos, window, sinks=sinks)
        np.testing.assert_allclose(got, want, atol=1e-5)


@requires_torch
def test_torch_form_matches_the_reference():
    import torch

    from edgeattn.attention.cached_torch import cached_windowed_attention, write_ring_

    torch.manual_seed(0)
    for sinks, wmax, window in [(2, 6, 0), (2, 6, 3), (0, 5, 0), (4, 8, 5)]:
        pk = torch.zeros(2, 2, sinks + wmax, 8)
        pv = torch.zeros_like(pk)
        n = 0
        for s in (min(c, wmax) for c in CHUNKS):
            q, qs = torch.randn(2, 4, s, 8), torch.randn(2, 4, s, 8)
            k, v = torch.randn(2, 2, s, 8), torch.randn(2, 2, s, 8)
            pos = torch.tensor([n, n])
            got = cached_windowed_attention(q, qs, k, v, pk, pv, pos, torch.tensor(window), sinks=sinks)
            want = cached_attention_np(q, qs, k, v, pk, pv, pos.numpy(), window, sinks=sinks)
            np.testing.assert_allclose(got.numpy(), want, atol=1e-5)
            write_ring_(pk, pv, k, v, pos, sinks)
            n += s


def test_ring_layout():
    layout = RingLayout(2, 4)
    for n in range(12):
        rows = layout.row_positions(n)
        held = {int(p) for p in rows if p >= 0}
        assert held == set(range(min(2, n))) | set(range(max(2, n - 4), n))
        assert all(layout.slots(p) == row for row, p in enumerate(rows) if p >= 0)
    assert layout.live_window(0) == 4 and layout.live_window(9) == 4 and layout.live_window(3) == 3
    np.testing.assert_array_equal(layout.sink_positions(np.array([1, 5, 100]), 3), [1, 5, 5])
