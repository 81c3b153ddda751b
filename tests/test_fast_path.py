"""The fast path of a cpu decoder bundle (runtime/generation/fast_path.py): the fast path runs the steps of
streams still inside their window with GroupQueryAttention writing the cache buffers in place; every other
step runs the ring graph. Checked against the ring graph alone over a two-stream run that crosses from one to
the other and back, and the build's switch."""

from __future__ import annotations

import json

import numpy as np
import pytest

from decoder_fixtures import SINKS, WINDOW_MAX, requires_decoder_stack
from edgeattn.runtime.generation.fast_path import eligible

pytestmark = requires_decoder_stack


@pytest.mark.parametrize("positions, chunk, window, want", [
    ([0], 5, 0, True), ([SINKS + WINDOW_MAX - 1], 1, 0, True), ([SINKS + WINDOW_MAX - 1], 2, 0, False),
    ([10, 3], 1, 8, True), ([11, 3], 2, 8, False), ([SINKS + 8], 1, 8, False), ([0], 1, WINDOW_MAX + 9, True)])
def test_a_step_is_eligible_while_every_stream_is_inside_its_window(positions, chunk, window, want):
    assert eligible(SINKS, WINDOW_MAX, np.array(positions), chunk, window) is want


@pytest.mark.parametrize("positions, chunk, limit, want", [
    ([10], 2, 12, True), ([10], 3, 12, False), ([0, 11], 1, 12, True), ([SINKS + WINDOW_MAX - 1], 1, 1000, True)])
def test_a_step_is_eligible_only_before_the_fast_paths_last_position(positions, chunk, limit, want):
    assert eligible(SINKS, WINDOW_MAX, np.array(positions), chunk, 0, limit) is want


def test_the_fast_path_rotates_by_constant_tables_and_ends_where_they_end(tiny_decoder):
    """Its rotation tables are constants over the model's 512 positions (no Cos / Sin / Pad a step, no
    position_ids): a ring larger than that runs the fast path up to position 512, the ring graph after,
    with the ring graph's logits throughout."""
    import onnx

    from edgeattn.bundle.folder import open_bundle
    from edgeattn.runtime.generation.decoder_bundle import DecoderModel

    _, _, _, bundle_path = tiny_decoder
    bundle = open_bundle(bundle_path)
    assert bundle.manifest.sections["decoder"]["fast_path_positions"] == 512  # max_position_embeddings > 4 + 48
    assert bundle.manifest.sections["decoder"]["fast_path_rotation"] == ["constant tables of 512 positions"]
    graph = onnx.load(str(bundle.file("model.fast_path.onnx"))).graph
    ops = [n.op_type for n in graph.node]
    assert not {"Cos", "Sin", "Pad"} & set(ops)
    gqa = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == 2 and all(len(n.input) > 9 and n.input[9] == "" for n in gqa)  # no position_ids
    fast, ring = (DecoderModel(bundle, window_max=600).activate() for _ in range(2))
    ring.fast_path = False
    caches = [fast.new_cache(1), ring.new_cache(1)]
    rng = np.random.default_rng(2)
    for chunk in [100] * 5 + [6, 6, 1, 1, 1]:  # the fast path up to 506 + 6 = 512, the ring graph from 512 on
        ids = rng.integers(0, 1000, (1, chunk))
        got = fast.step(caches[0], [0], ids, 0)
        np.testing.assert_allclose(got, ring.step(caches[1], [0], ids, 0), atol=1e-4, rtol=1e-4)
    (binding,) = caches[0].bindings.values()
    assert binding.positions.tolist() == [506] and caches[0].positions.tolist() == [515]  # its last step: 506-511


def test_the_fast_path_gives_the_ring_graphs_logits_and_cache(tiny_decoder):
    from edgeattn.bundle.folder import open_bundle
    from edgeattn.runtime.generation.decoder_bundle import DecoderModel

    _, _, _, bundle_path = tiny_decoder
    bundle = open_bundle(bundle_path)
    assert bundle.manifest.sections["decoder"]["fast_path_model"] == "model.fast_path.onnx"
    assert bundle.manifest.sections["decoder"]["fast_path_parity"]["status"] == "pass"
    fast, ring = DecoderModel(bundle).activate(), DecoderModel(bundle).activate()
    ring.fast_path = False
    caches = [fast.new_cache(2), ring.new_cache(2)]
    rng = np.random.default_rng(1)
    paths, returned = [], []
    for chunk, window in [(5, 0), (1, 0), (1, 0), (7, 0), (1, 0), (3, 20), (1, 20), (1, 20), (2, 0)] * 5:
        ids = rng.integers(0, 1000, (2, chunk))
        paths.append(eligible(SINKS, WINDOW_MAX, caches[0].positions, chunk, window, fast.fast_path_positions))
        last_only = bool(rng.integers(0, 2))  # the fast path writes the logits into an array of its own
        got = fast.step(caches[0], [0, 1], ids, window, last_only=last_only)
        want = ring.step(caches[1], [0, 1], ids, window, last_only=last_only)
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
        returned.append((got, got.copy()))
    for got, kept in returned:  # the arrays bound to the graph are written again at every step: never handed out
        np.testing.assert_array_equal(got, kept)
    assert paths[0] and not paths[-1] and sum(paths) > 5  # both paths ran, and back to fast after a small window
    assert any(a and not b for a, b in zip(paths, paths[1:])) and any(b and not a for a, b in zip(paths, paths[1:]))
    assert caches[0].bindings and not caches[1].bindings  # the fast path really ran, on the first cache only
    np.testing.assert_array_equal(caches[0].positions, caches[1].positions)
    for a, b in zip(caches[0].keys + caches[0].values, caches[1].keys + caches[1].values):
        np.testing.assert_allclose(a, b, atol=1e-5)  # the op wrote the same rows the host writes for the ring


def test_streams_that_are_not_consecutive_take_the_ring_graph(tiny_decoder):
    from edgeattn.bundle.folder import open_bundle
    from edgeattn.runtime.generation.decoder_bundle import DecoderModel

    _, _, _, bundle_path = tiny_decoder
    model = DecoderModel(open_bundle(bundle_path)).activate()
    cache = model.new_cache(3)
    ids = np.array([[5, 6], [7, 8]])
    model.step(cache, [0, 2], ids, 0)
    assert model._linear is None and cache.positions.tolist() == [2, 0, 2]
    model.step(cache, [0, 1], ids, 0)
    assert model._linear is not None and cache.positions.tolist() == [4, 2, 2]


def test_a_build_without_the_fast_path(tiny_decoder, tmp_path):
    from edgeattn.bundle.build import BuildConfig, build
    from edgeattn.runtime.generation.decoder_bundle import DecoderModel

    _, _, onnx_path, _ = tiny_decoder
    bundle = build(onnx_path, BuildConfig(target="cpu", out=tmp_path / "b.edgeattn", seq=(1, 1, 32),
                                          dims=(("cache", (8, 52, 52)),), fast_path=False))
    manifest = json.loads((bundle.path / "manifest.json").read_text())
    assert "fast_path_model" not in manifest["sections"]["decoder"] and not (bundle.path / "model.fast_path.onnx").exists()
    assert not DecoderModel(bundle).fast_path
