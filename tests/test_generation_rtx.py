"""Decoder bundles for the rtx target: TensorRT for RTX builds the engine on this machine (no GPU), with the
cached attention nodes on the plugin (which writes the cache in place at run time); running it needs an RTX GPU."""

from __future__ import annotations

import pytest

from decoder_fixtures import requires_decoder_stack
from edgeattn.errors import EdgeAttnError
from onnx_fixtures import has

pytestmark = [pytest.mark.rtx, requires_decoder_stack,
              pytest.mark.skipif(not has("tensorrt_rtx"), reason="needs tensorrt-rtx")]


def test_decoder_engine_builds_with_the_cached_op_on_the_plugin(tiny_decoder, tmp_path, monkeypatch):
    from edgeattn.bundle.build import BuildConfig, build
    from edgeattn.runtime.generation.generator import Generator

    monkeypatch.setenv("EDGEATTN_CACHE_DIR", str(tmp_path / "cache"))
    _, _, onnx_path, _ = tiny_decoder
    bundle = build(onnx_path, BuildConfig(target="rtx", out=tmp_path / "rtx.edgeattn", seq=(1, 1, 32),
                                          dims=(("cache", (8, 52, 52)),)))
    m = bundle.manifest
    assert m.artifact == "model.engine" and m.sections["engine"]["plugin_registered"] is True
    assert [a["to"] for a in m.sections["engine"]["attention"]] == ["plugin", "plugin"]  # 2 layers
    assert not m.sections["problems"]
    assert {"tokenizer.json", "generation.json"} <= set(m.files) and m.sections["decoder"]["sinks"] == 4
    if not has("torch") or __import__("edgeattn.gpu", fromlist=["detect_gpu"]).detect_gpu() is None:
        with pytest.raises(EdgeAttnError, match="GPU|CUDA"):  # a clear error, not a crash, without a GPU
            with Generator.open(bundle.path) as gen:
                gen.generate("hi")
