"""The cpu build of a decoder: RMSNorm spelled for ONNX Runtime's fusion, RoPE fused into RotaryEmbedding with
per-step angle tables, cached attention lowered with one ring geometry. Checked on a real export (the tiny
Llama): what fired, the node counts ONNX Runtime runs, and the outputs against the unprocessed export."""

from __future__ import annotations

import collections
import json

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

from decoder_fixtures import SINKS, WINDOW_MAX, requires_decoder_stack
from edgeattn.passes import PassContext
from edgeattn.passes.plans import plan_for
from edgeattn.passes.rmsnorm_cpu import FuseRmsNormForCpu
from edgeattn.passes.rotary_cpu import FuseRotaryForCpu
from edgeattn.targets import get_target

pytestmark = requires_decoder_stack
LAYERS = 2


@pytest.fixture(scope="module")
def fused_bundle(tiny_decoder, tmp_path_factory):
    """The same export built with `--cached-attention fused` (GroupQueryAttention)."""
    from edgeattn.bundle.build import BuildConfig, build

    _, _, onnx_path, _ = tiny_decoder
    out = tmp_path_factory.mktemp("fused") / "tiny_dec_fused.edgeattn"
    return build(onnx_path, BuildConfig(target="cpu", out=out, seq=(1, 1, 32), dims=(("cache", (8, 52, 52)),),
                                        cached_attention="fused")).path


def _feeds(sess: ort.InferenceSession, *, batch: int, seq: int, positions, window: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": rng.integers(0, 1000, (batch, seq)).astype(np.int64),
             "cache_position": np.asarray(positions, np.int64), "attention_window": np.array(window, np.int64)}
    for i in sess.get_inputs():
        if i.name.startswith("past_key_values"):
            feeds[i.name] = rng.standard_normal((batch, i.shape[1], SINKS + WINDOW_MAX, i.shape[3])).astype(np.float32)
    return feeds


def _session(path_or_model) -> ort.InferenceSession:
    src = path_or_model if isinstance(path_or_model, str) else path_or_model.SerializeToString()
    return ort.InferenceSession(src, providers=["CPUExecutionProvider"])


def test_the_built_decoder_runs_fused_ops_and_few_nodes(tiny_decoder):
    _, _, onnx_path, bundle_path = tiny_decoder
    manifest = json.loads((bundle_path / "manifest.json").read_text())
    passes = {p["name"]: p for p in manifest["sections"]["passes"]} if isinstance(manifest["sections"]["passes"], list) \
        else manifest["sections"]["passes"]
    assert passes["lower-cached-cpu"]["details"]["lowered"] == LAYERS
    assert passes["lower-cached-cpu"]["details"]["geometries"] == 1
    assert passes["fuse-rmsnorm-cpu"]["details"]["fused"] == 2 * LAYERS + 1
    assert passes["fuse-rotary-cpu"]["details"]["fused"] == 3 * LAYERS  # query at t, query for the sinks, key
    assert passes["fuse-rotary-cpu"]["details"]["tables"] == 2  # positions t, sink positions min(t, sinks + W)
    assert passes["fuse-rmsnorm-cpu"]["details"]["with_residual"] == 2 * LAYERS  # all but the first norm
    assert passes["pack-matmuls-cpu"]["details"] == {"packed": 2 * LAYERS, "projections": 5 * LAYERS,
                                                     "into_attention": 0}  # QKV, gate/up
    assert passes["logits-to-keep"]["details"]["added"]
    ops = collections.Counter(n.op_type for n in onnx.load(str(bundle_path / "model.ort.onnx")).graph.node)
    assert ops["SimplifiedLayerNormalization"] == 1 and ops["SkipSimplifiedLayerNormalization"] == 2 * LAYERS
    assert ops["MatMul"] + ops["FusedMatMul"] == 4 * LAYERS + 1 + 5 * LAYERS  # QKV, o, gate/up, down, LM head; attention: 3 scores, 2 sums
    assert ops["RotaryEmbedding"] == 3 * LAYERS and ops["Pow"] == 0
    assert ops["Neg"] == 1  # logits_to_keep's start; no rotate_half negation is left
    assert sum(ops.values()) < 60 * LAYERS + 80  # ~70 shared (geometry, tables); the op body alone was 136 a layer


def test_the_fused_form_runs_group_query_attention_and_fewer_nodes(fused_bundle):
    bundle_path = fused_bundle
    manifest = json.loads((bundle_path / "manifest.json").read_text())
    passes = {p["name"]: p for p in manifest["sections"]["passes"]} if isinstance(manifest["sections"]["passes"], list) \
        else manifest["sections"]["passes"]
    lowering = passes["lower-cached-cpu"]
    assert lowering["details"]["lowered"] == LAYERS and lowering["details"]["group_query_attention"] == LAYERS
    assert lowering["details"]["geometries"] == 1 and not lowering["problems"]
    assert passes["fuse-rmsnorm-cpu"]["details"]["fused"] == 2 * LAYERS + 1
    assert passes["fuse-rotary-cpu"]["details"]["fused"] == 3 * LAYERS  # query at t, query for the sinks, key
    assert passes["fuse-rotary-cpu"]["details"]["tables"] == 2  # positions t, sink positions min(t, sinks + W)
    assert passes["fuse-rmsnorm-cpu"]["details"]["with_residual"] == 2 * LAYERS  # all but the first norm
    assert passes["pack-matmuls-cpu"]["details"] == {"packed": 2 * LAYERS, "projections": 5 * LAYERS,
                                                     "into_attention": LAYERS}  # QKV read whole by the op; gate/up
    assert passes["logits-to-keep"]["details"]["added"]
    ops = collections.Counter(n.op_type for n in onnx.load(str(bundle_path / "model.ort.onnx")).graph.node)
    assert ops["SimplifiedLayerNormalization"] == 1 and ops["SkipSimplifiedLayerNormalization"] == 2 * LAYERS
    assert ops["GroupQueryAttention"] == LAYERS and ops["MatMul"] == 4 * LAYERS + 1  # QKV, o, gate/up, down, LM head
    assert ops["Split"] == LAYERS  # gate/up only: the op reads the packed QKV itself
    assert ops["RotaryEmbedding"] == LAYERS and ops["Pow"] == 0  # the gathered sink keys; q and k rotate in the op
    assert ops["Neg"] == 1  # logits_to_keep's start; no rotate_half negation is left
    per_layer = {"GroupQueryAttention", "GatherND", "RotaryEmbedding", "Slice", "MatMul", "Split",
                 "SkipSimplifiedLayerNormalization", "QuickGelu", "Mul"}
    assert sum(ops.values()) < 17 * LAYERS + 130, ops  # ~120 shared (geometry, tables); the op body alone was 136 a layer
    assert sum(v for k, v in ops.items() if k in per_layer) <= 15 * LAYERS + 20


@pytest.mark.parametrize("batch, seq, positions, window", [(1, 1, [3], 0), (1, 5, [40], 0), (2, 1, [0, 70], 8),
                                                           (2, 3, [9, 200], 5)])
@pytest.mark.parametrize("form", ["ops", "fused"])
def test_the_built_decoder_matches_the_export(tiny_decoder, fused_bundle, batch, seq, positions, window, form):
    """Positions past the ring (70, 200 > sinks + W_max) and beyond max_position_embeddings are not special."""
    _, _, onnx_path, bundle_path = tiny_decoder
    bundle_path = fused_bundle if form == "fused" else bundle_path
    want_sess, got_sess = _session(str(onnx_path)), _session(str(bundle_path / "model.ort.onnx"))
    feeds = _feeds(want_sess, batch=batch, seq=seq, positions=positions, window=window)
    wants = want_sess.run(None, feeds)
    for want, got in zip(wants, got_sess.run(None, {**feeds, "logits_to_keep": np.array(0, np.int64)})):
        np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-4)
    last = got_sess.run(["logits"], {**feeds, "logits_to_keep": np.array(1, np.int64)})[0]
    assert last.shape == (batch, 1, wants[0].shape[2])  # the LM head ran for the last position only
    np.testing.assert_allclose(last, wants[0][:, -1:], atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("form", ["ops", "fused"])
def test_a_stream_past_the_ring_matches_the_body_chunk_by_chunk(tiny_decoder, fused_bundle, form):
    """Both cpu forms (plain ops; GroupQueryAttention over the gathered ring rows with the sink keys rotated per
    query row) against the export, which runs the op's own ONNX body: two streams at different positions in one batch, the host
    writing each one's ring as it goes, chunks of 1 to 7 tokens, the window changed on the way, positions three
    times past sinks + W_max."""
    from edgeattn.attention.ring import RingLayout
    from edgeattn.runtime.generation.cache import KVCache

    _, _, onnx_path, bundle_path = tiny_decoder
    bundle_path = fused_bundle if form == "fused" else bundle_path
    want_sess, got_sess = _session(str(onnx_path)), _session(str(bundle_path / "model.ort.onnx"))
    kv = next(i for i in want_sess.get_inputs() if i.name.startswith("past_key_values"))
    presents = [o.name for o in want_sess.get_outputs() if o.name.startswith("present")]
    layout = RingLayout(sinks=SINKS, window_max=WINDOW_MAX)
    caches = [KVCache(layers=LAYERS, kv_heads=kv.shape[1], head_dim=kv.shape[3], layout=layout, streams=2)
              for _ in range(2)]
    rng = np.random.default_rng(7)
    warm = rng.integers(0, 1000, (1, 9))  # stream 1 starts 9 tokens ahead
    for cache in caches:
        cache.positions[1] = 0
    chunks = [(5, 0), (1, 0), (7, 8), (1, 8), (1, 20), (3, 20)] * 9 + [(1, 0), (2, 5), (1, 48)]
    steps = 0
    for size, window in [(9, 0)] + chunks:
        streams = [1] if steps == 0 else [0, 1]
        ids = warm if steps == 0 else rng.integers(0, 1000, (2, size))
        feeds = {"input_ids": ids.astype(np.int64), "attention_window": np.array(window, np.int64)}
        outs = []
        for sess, cache in ((want_sess, caches[0]), (got_sess, caches[1])):
            f = {**feeds, "cache_position": cache.positions[streams].copy()}
            f.update(zip([i.name for i in want_sess.get_inputs() if i.name.startswith("past_key_values")],
                         cache.past(np.asarray(streams))))
            got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, f)))
            cache.write([got[n] for n in presents], streams)
            outs.append(got["logits"])
        np.testing.assert_allclose(outs[1], outs[0], atol=2e-4, rtol=1e-4)
        steps += 1
    assert caches[0].positions.tolist() == caches[1].positions.tolist() and caches[1].positions[0] > 3 * (SINKS + WINDOW_MAX)
    np.testing.assert_allclose(caches[1].keys[1], caches[0].keys[1], atol=1e-5)  # the rings hold the same keys


def test_the_runtime_asks_for_the_last_position_only(tiny_decoder):
    from edgeattn.runtime.generation.generator import Generator

    _, _, _, bundle_path = tiny_decoder
    ids = np.array([list(range(300, 311))])
    with Generator.open(bundle_path) as gen:
        a, b = gen.model.new_cache(1), gen.model.new_cache(1)
        full, last = gen.model.step(a, [0], ids, 0), gen.model.step(b, [0], ids, 0, last_only=True)
        assert full.shape[1] == 11 and last.shape[1] == 1
        np.testing.assert_allclose(last[:, 0], full[:, -1], atol=1e-5)
        np.testing.assert_array_equal(a.keys[0], b.keys[0])  # the cache is written the same way


def test_rotary_pass_says_why_a_near_miss_is_left(tiny_decoder):
    """A Split/Neg/Concat whose result is not multiplied by sin (here: its Mul is turned into an Add)."""
    _, _, onnx_path, _ = tiny_decoder
    model = ir.serde.deserialize_model(onnx.load(str(onnx_path)))
    neg = next(n for n in model.graph if n.op_type == "Neg")
    cat = next(u.node for u in neg.outputs[0].uses())
    mul = next(u.node for u in cat.outputs[0].uses())
    mul.op_type = "Sub"
    result = FuseRotaryForCpu()(model, PassContext(get_target("cpu")))
    assert result.details["fused"] == 3 * LAYERS - 2  # both rotations that share that rotate_half(q) are left
    assert any("rotate_half(x) is not used" in p for p in result.problems)


def test_rmsnorm_pass_says_why_a_near_miss_is_left(tiny_decoder):
    _, _, onnx_path, _ = tiny_decoder
    model = ir.serde.deserialize_model(onnx.load(str(onnx_path)))
    sqrt = next(n for n in model.graph if n.op_type == "Sqrt")
    sqrt.op_type = "Abs"
    result = FuseRmsNormForCpu()(model, PassContext(get_target("cpu")))
    assert result.details["fused"] == 2 * LAYERS
    assert result.problems == [f"RMSNorm at {result.details['unfused'][0]['node']} left as element-wise ops: "
                               "mean + eps is not followed by Sqrt"]


def test_tensorrt_targets_keep_the_graph(tiny_decoder):
    _, _, onnx_path, _ = tiny_decoder
    for p in (FuseRmsNormForCpu(), FuseRotaryForCpu()):
        model = ir.serde.deserialize_model(onnx.load(str(onnx_path)))
        before = len(list(model.graph))
        plan = plan_for(get_target("rtx").backend)  # TensorRT fuses these itself: not in its plan
        results = plan.only(tuple(n for n in plan.passes if n == p.name)).run(model, PassContext(get_target("rtx")))
        assert not any(r.changed for r in results) and len(list(model.graph)) == before


def test_int4_projections_are_packed_and_match_the_int4_export(tiny_decoder, tmp_path):
    from edgeattn.bundle.build import BuildConfig, build
    from edgeattn.decoder.weight_only import quantize_weights_int4

    _, _, onnx_path, _ = tiny_decoder
    int4 = quantize_weights_int4(onnx_path, tmp_path / "tiny_int4.onnx")
    bundle = build(int4, BuildConfig(target="cpu", seq=(1, 1, 32), dims=(("cache", (8, 52, 52)),),
                                     out=str(tmp_path / "int4.edgeattn")))
    ops = collections.Counter(n.op_type for n in onnx.load(str(bundle.path / "model.ort.onnx")).graph.node)
    assert ops["MatMulNBits"] == 4 * LAYERS + 1  # QKV, o, gate/up, down; the LM head
    want_sess, got_sess = _session(str(int4)), _session(str(bundle.path / "model.ort.onnx"))
    feeds = _feeds(want_sess, batch=2, seq=3, positions=[5, 90], window=6)
    for want, got in zip(want_sess.run(None, feeds), got_sess.run(None, {**feeds, "logits_to_keep": np.array(0)})):
        np.testing.assert_allclose(got, want, atol=2e-3, rtol=1e-3)  # int8 activations: rounding may differ
