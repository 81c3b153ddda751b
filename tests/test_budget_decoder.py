"""The attention budget through a decoder bundle: a tiny Llama exported with a page size, built for cpu and run
on ONNX Runtime with retrieval pages, step by step against the PyTorch model fed the oracle's bounds (past the
ring's end); the runtime's bounds equal those recomputed from the rows; a bundle without bounds runs k = 0 and
refuses k > 0."""

from __future__ import annotations

import numpy as np
import pytest

from decoder_fixtures import SINKS, requires_decoder_stack, tiny_llama
from edgeattn.errors import ConfigError

WINDOW_MAX, PAGE = 48, 4
CHUNKS = [20, 1, 1, 5, 1, 1, 1, 30, 1, 1, 1, 7, 1, 1, 1, 1, 40, 1, 1]  # 115 tokens: the ring wraps twice

pytestmark = [requires_decoder_stack, pytest.mark.slow]


@pytest.fixture(scope="module")
def paged_bundle(tmp_path_factory):
    """(hf model, the cpu bundle of its export with pages of PAGE rows, its first layer dense under pages: one layer
    of each form)."""
    from edgeattn.bundle.build import BuildConfig, build
    from edgeattn.decoder.export import DecoderExportConfig, export_decoder_model

    model, tok = tiny_llama()
    folder = tmp_path_factory.mktemp("paged")
    onnx_path = export_decoder_model(model, tok, folder / "tiny_paged.onnx",
                                     DecoderExportConfig(sinks=SINKS, window_max=WINDOW_MAX, page=PAGE, dense_layers=1))
    bundle = build(onnx_path, BuildConfig(target="cpu", seq=(1, 1, 32), dims=(("cache", (8, 52, 52)),)))
    return model, bundle.path


def _reference_steps(model, ids, window, pages, dense_layers=0, chunks=CHUNKS):
    """Logits chunk by chunk from the PyTorch model (the op's eager form), its bounds recomputed from the rows."""
    import torch

    from edgeattn.attention.cached_reference import page_bounds_np
    from edgeattn.attention.cached_torch import write_ring_
    from edgeattn.decoder.cached_llama import CachedDecoder

    ref = CachedDecoder(model, SINKS, PAGE, dense_layers).eval()
    layers = len(ref.layers)
    past = [torch.zeros(1, ref.kv_heads, SINKS + WINDOW_MAX, ref.head_dim) for _ in range(2 * layers)]
    n, outs = 0, []
    for s in chunks:
        pos = torch.tensor([n])
        bounds = [torch.from_numpy(page_bounds_np(past[2 * i].numpy(), pos.numpy(), SINKS, PAGE)) for i in range(layers)]
        with torch.no_grad():
            out = ref(torch.from_numpy(ids[None, n:n + s]), pos, torch.tensor(window), torch.tensor(pages), *past,
                      *bounds)
        for i in range(layers):
            write_ring_(past[2 * i], past[2 * i + 1], out[1 + 2 * i], out[2 + 2 * i], pos, SINKS)
        outs.append(out[0].numpy())
        n += s
    return outs, past


@pytest.mark.parametrize("window", [8, 40])
def test_the_bundle_with_pages_equals_the_reference_step_by_step(paged_bundle, window):
    """Window 8: every chunk on the ring path; window 40: the first chunks inside the window run on the fast path
    (written for a bundle with a dense layer too: it reads at least the live window)."""
    from edgeattn.attention.cached_reference import page_bounds_np
    from edgeattn.bundle.folder import open_bundle
    from edgeattn.runtime.generation.decoder_bundle import DecoderModel

    model, path = paged_bundle
    ids = np.random.default_rng(0).integers(0, 1000, sum(CHUNKS))
    want, past = _reference_steps(model, ids, window, 2, dense_layers=1)
    dec = DecoderModel(open_bundle(path)).activate()
    assert dec.info["dense_layers"] == 1 and dec.fast_path
    try:
        cache, window_only = dec.new_cache(1), dec.new_cache(1)
        n = 0
        for s, expected in zip(CHUNKS, want):
            got = dec.step(cache, [0], ids[None, n:n + s], window, pages=2)
            alone = dec.step(window_only, [0], ids[None, n:n + s], window)
            np.testing.assert_allclose(got, expected, atol=1e-5 * np.abs(expected).max())
            n += s
        assert np.abs(got - alone).max() > 1e-3  # past the window, the pages change the logits
        for layer in range(len(cache.bounds)):  # kept by the ring writes == recomputed from the rows
            np.testing.assert_array_equal(cache.bounds[layer],
                                          page_bounds_np(cache.keys[layer], cache.positions, SINKS, PAGE))
            np.testing.assert_allclose(cache.keys[layer], past[2 * layer].numpy(), atol=1e-5)
    finally:
        dec.deactivate()


def test_a_bundle_without_bounds_runs_the_window_and_refuses_pages(tiny_decoder):  # noqa: F811 - the fixture
    from edgeattn.attention.budget import AttentionBudget
    from edgeattn.bundle.folder import open_bundle
    from edgeattn.runtime.generation.decoder_bundle import DecoderModel

    _, _, _, path = tiny_decoder
    dec = DecoderModel(open_bundle(path)).activate()
    try:
        cache = dec.new_cache(1)
        ids = np.array([[5, 6, 7]])
        base = dec.step(cache, [0], ids, 0, pages=0)
        assert base.shape[:2] == (1, 3) and cache.positions[0] == 3
        with pytest.raises(ConfigError, match="found one without them .* pages 0"):
            dec.step(cache, [0], ids, 8, pages=2)
        with pytest.raises(ConfigError, match="retrieval pages"):
            dec.check_budget(AttentionBudget(8, 2))
        assert cache.positions[0] == 3  # refused before any work
    finally:
        dec.deactivate()


def test_dense_layers_read_the_whole_ring_under_pages_and_change_nothing_for_a_window():
    """The first N layers read the whole ring when k > 0: with every layer dense a budget is full attention (window
    0, no pages); with one it is neither that nor the plain budget; with k = 0 a window is the same in every case."""
    model, _ = tiny_llama()
    layers = model.config.num_hidden_layers
    ids = np.random.default_rng(1).integers(0, 1000, sum(CHUNKS))
    full, _ = _reference_steps(model, ids, 0, 0)
    budget, _ = _reference_steps(model, ids, 8, 2)
    all_dense, _ = _reference_steps(model, ids, 8, 2, dense_layers=layers)
    one_dense, _ = _reference_steps(model, ids, 8, 2, dense_layers=1)
    window, _ = _reference_steps(model, ids, 8, 0)
    window_dense, _ = _reference_steps(model, ids, 8, 0, dense_layers=1)
    for a, b in zip(all_dense, full):
        np.testing.assert_allclose(a, b, atol=1e-5)
    for a, b in zip(window_dense, window):
        np.testing.assert_array_equal(a, b)
    last = slice(-3, None)  # past the ring's first wrap
    assert min(np.abs(a - b).max() for a, b in zip(one_dense[last], budget[last])) > 1e-3
    assert min(np.abs(a - b).max() for a, b in zip(one_dense[last], full[last])) > 1e-3


def test_a_budget_of_every_page_is_full_attention_sinks_included():
    """Token by token from t = 0 to sinks + W_max (the ring full, not yet wrapped), a budget whose pages cover the
    ring reads every row, and its sinks sit at their whole-ring distance (min(t, sinks + W_max)), not the window's
    (sinks + W): it equals window 0 (with the sinks at sinks + W it would differ from t = sinks + W on)."""
    model, _ = tiny_llama()
    steps = [1] * (SINKS + WINDOW_MAX)
    ids = np.random.default_rng(2).integers(0, 1000, len(steps))
    full, _ = _reference_steps(model, ids, 0, 0, chunks=steps)
    budget, _ = _reference_steps(model, ids, 8, WINDOW_MAX // PAGE, chunks=steps)
    window, _ = _reference_steps(model, ids, 8, 0, chunks=steps)
    for a, b in zip(budget, full):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert np.abs(window[-1] - full[-1]).max() > 1e-3  # the window alone does differ


def test_dense_layers_need_pages():
    from edgeattn.decoder.export import DecoderExportConfig
    from edgeattn.errors import ConfigError as Error

    with pytest.raises(Error, match="dense_layers: expected 0, or layers read whole under a budget with a page size"):
        DecoderExportConfig(dense_layers=2)
