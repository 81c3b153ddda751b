"""A decoder builds with no options: its sample shapes come from its cache layout, `--seq` is the chunk
length, and parity is judged on the logits' own scale (their magnitude reaches hundreds here)."""

from __future__ import annotations

import json

import pytest

from decoder_fixtures import SINKS, WINDOW_MAX, requires_decoder_stack, tiny_llama

pytestmark = [requires_decoder_stack, pytest.mark.slow]

LOGIT_SCALE = 64.0  # on top of the fixture's 8: logits of ~800, where float32 reordering alone differs by > 1e-4


@pytest.fixture(scope="module")
def loud_decoder(tmp_path_factory):
    """A tiny decoder ONNX whose LM head is scaled up: large logits, as a real model's."""
    import torch

    from edgeattn.decoder.export import DecoderExportConfig, export_decoder_model

    model, tok = tiny_llama()
    with torch.no_grad():
        model.lm_head.weight.mul_(LOGIT_SCALE)
    folder = tmp_path_factory.mktemp("loud")
    return export_decoder_model(model, tok, folder / "loud.onnx", DecoderExportConfig(sinks=SINKS, window_max=WINDOW_MAX))


def test_a_decoder_builds_with_no_options_and_says_what_parity_compared(loud_decoder, runner, tmp_path):
    from edgeattn.cli.main import cli

    out = tmp_path / "d"
    result = runner.invoke(cli, ["build", str(loud_decoder), "--target", "cpu", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "parity: pass, relative diff" in result.output and "greedy agreement 100%" in result.output
    assert "pass fuse-rotary-cpu: changed in" in result.output  # each pass with its time and what it changed
    manifest = json.loads((out / "manifest.json").read_text())
    parity = manifest["sections"]["parity"]
    assert parity["status"] == "pass" and parity["reference_max_abs"] > 100
    assert parity["relative_diff"] == pytest.approx(parity["max_abs_diff"] / parity["reference_max_abs"])
    assert parity["greedy_agreement"] == 1.0 and "greedy" in parity["compared"]
    assert parity["sizes"]["seq"] > 1  # a prefill chunk: greedy agreement over several positions
    ring = SINKS + WINDOW_MAX
    assert manifest["shape_ranges"]["cache"] == [SINKS + 1, ring, ring]  # the cache layout, not --seq
    assert manifest["shape_ranges"]["seq"] == [1, 1, WINDOW_MAX]
    assert manifest["sections"]["dimension_kinds"]["cache"] == "cache"


def test_seq_is_the_chunk_length_and_never_the_cache(loud_decoder, tmp_path):
    from edgeattn.bundle.build import BuildConfig, build

    bundle = build(loud_decoder, BuildConfig(target="cpu", out=tmp_path / "d", seq=(1, 1, 256), fast_path=False))
    ranges = bundle.manifest.shape_ranges
    assert ranges["seq"] == [1, 1, 256] and ranges["cache"] == [SINKS + 1, SINKS + WINDOW_MAX, SINKS + WINDOW_MAX]
    assert bundle.manifest.sections["parity"]["status"] == "pass"


def test_a_cache_range_smaller_than_the_sinks_is_refused_before_the_build(loud_decoder, tmp_path):
    from edgeattn.bundle.build import BuildConfig, build
    from edgeattn.errors import ConfigError

    with pytest.raises(ConfigError, match=f"expected at least {SINKS + 1} rows"):
        build(loud_decoder, BuildConfig(target="cpu", out=tmp_path / "d", dims=(("cache", (1, 8, 8)),)))
    assert not (tmp_path / "d").exists()


def test_a_decoder_bundle_keeps_one_copy_of_the_ring_graphs_weights(loud_decoder, tmp_path):
    """The runtime loads the ONNX Runtime-optimized artifact and the fast path: the processed model.onnx, a
    third copy of the weights, is left out, the fast path reads the artifact's weights, and the manifest says so."""
    from edgeattn.bundle.build import BuildConfig, build
    from edgeattn.runtime.generation.generator import GenerationConfig, Generator

    bundle = build(loud_decoder, BuildConfig(target="cpu", out=tmp_path / "d", parity=False))
    assert sorted(bundle.manifest.files) == ["generation.json", "model.fast_path.onnx", "model.ort.onnx", "model.weights",
                                             "report.md", "tokenizer.json"]
    assert not (bundle.path / "model.onnx").exists()
    assert "left out" in bundle.manifest.sections["files"]["processed_model"]
    assert "model.onnx left out" in bundle.report.read_text()
    # the fast path points at the artifact's weights instead of holding a second copy
    weights = (bundle.path / "model.weights").stat().st_size
    shared = bundle.manifest.sections["decoder"]["fast_path_shared_bytes"]
    assert shared > weights / 3 and (bundle.path / "model.fast_path.onnx").stat().st_size < weights / 10
    with Generator.open(bundle.path) as gen:
        result = gen.generate("Hello", GenerationConfig(max_tokens=3))
    assert 1 <= result.completion_tokens <= 3
