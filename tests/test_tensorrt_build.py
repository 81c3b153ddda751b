"""Real engine builds with TensorRT for RTX on the CPU (and full TensorRT where it is installed).

Each engine build runs in its own process (edgeattn.engines.tensorrt.worker). The `tensorrt` cases need full
TensorRT and a GPU, and skip with the reason otherwise.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

import trt_fixtures as fx
from edgeattn.bundle.build import BuildConfig, build
from edgeattn.cli.main import cli
from edgeattn.errors import BuildError, StrictModeError
from edgeattn.targets import detect_gpu
from onnx_fixtures import has

RTX = pytest.param("rtx", marks=[pytest.mark.rtx, pytest.mark.skipif(not has("tensorrt_rtx"),
                                                                      reason="needs tensorrt-rtx (pip install 'edgeattn[rtx]')")])
TRT = pytest.param("h100", marks=[pytest.mark.tensorrt, pytest.mark.skipif(
    not has("tensorrt") or detect_gpu() is None,
    reason="needs full TensorRT and an NVIDIA GPU: TensorRT builds on the device it targets (not installable on CI)")])
TARGETS = [RTX, TRT]
SEQ = (1, 16, 64)  # wide enough for two optimization profiles


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEATTN_CACHE_DIR", str(tmp_path / "cache"))


def _save(model: onnx.ModelProto, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def _build(tmp_path, model, name, target, **kw):
    return build(_save(model, tmp_path, name), BuildConfig(target=target, seq=SEQ, **kw))


def _compute_rows(bundle):
    return [r for r in bundle.manifest.sections["engine"]["layers"] if r["compute"] and r["profile"] == 0]


@pytest.mark.parametrize("target", TARGETS)
def test_fp16_engine_keeps_io_types_and_reports_layers(tmp_path, target):
    bundle = _build(tmp_path, fx.mlp(), "mlp", target, precision="fp16")
    m = bundle.manifest
    assert bundle.artifact.name == "model.engine" and bundle.artifact.stat().st_size > 10_000
    assert "model.engine" in m.files
    assert [(t.name, t.dtype) for t in m.inputs + m.outputs] == [("x", "float32"), ("y", "float32")]
    rows = _compute_rows(bundle)
    assert {n for r in rows for n in r["onnx_nodes"]} == {"fc1", "fc2"}
    assert {r["precision"] for r in rows} == {"fp16"}
    assert m.precision["compute_layers"] == {"fp16": 2} and m.precision["float_layers"] == []
    assert m.sections["problems"] == [] and m.sections["parity"]["status"] == "skipped"
    engine = m.sections["engine"]
    assert len(engine["profiles"]) == 2 and engine["float_cast"]["boundary_casts"] == ["x", "y"]
    report = bundle.report.read_text()
    assert "## Engine layers" in report and "| fc1" in report and "Compute layers left in fp32: none" in report


@pytest.mark.parametrize("target", TARGETS)
def test_int8_qdq_layers_run_in_int8(tmp_path, target):
    bundle = _build(tmp_path, fx.int8_qdq(opset=19), "w8a8", target, precision="fp16")
    rows = _compute_rows(bundle)
    assert len(rows) == 2 and {r["precision"] for r in rows} == {"int8"}
    assert bundle.manifest.precision["graph"]["compute_layers"] == {"int8": 2}
    assert bundle.manifest.sections["problems"] == []


@pytest.mark.parametrize("target", TARGETS)
def test_int4_weight_only_layers(tmp_path, target):
    bundle = _build(tmp_path, fx.int4_weight_only(), "w4", target, precision="fp16")
    assert {r["precision"] for r in _compute_rows(bundle)} == {"int4+fp16"}
    assert bundle.manifest.sections["problems"] == []
    if target == "rtx":  # Turing has no INT4: the engine names the SMs it runs on
        engine = bundle.manifest.sections["engine"]
        assert [d["sm"] for d in engine["dropped_compute_capabilities"]] == [75]
        assert "int4" in engine["dropped_compute_capabilities"][0]["reason"]
        assert "SM75" not in engine["applied"]["compute_capabilities"]


@pytest.mark.parametrize("target", TARGETS)
def test_attention_goes_to_the_plugin(tmp_path, target):
    bundle = _build(tmp_path, fx.attention(), "attn", target, precision="fp16", strict=True)
    engine = bundle.manifest.sections["engine"]
    assert engine["attention"] == [{"node": "attn0", "to": "plugin"}]
    assert engine["plugin_registered"] is True and "ENABLE_PLUGIN_OVERRIDE" in engine["parser_flags"]
    plugin_rows = [r for r in engine["layers"] if r["onnx_nodes"] == ["attn0"] and r["profile"] == 0]
    assert len(plugin_rows) == 1 and plugin_rows[0]["type"] == "custom_layer" and plugin_rows[0]["precision"] == "fp16"
    assert "attn0 -> plugin" in bundle.report.read_text()


@pytest.mark.parametrize("target", TARGETS)
def test_strict_fails_when_attention_cannot_use_the_plugin(tmp_path, target):
    with pytest.raises(StrictModeError, match="attn0 went to the portable body.*q has rank 3"):
        _build(tmp_path, fx.attention(rank=3), "attn3", target, precision="fp16", strict=True)
    assert not (tmp_path / "attn3.edgeattn").exists()
    # without --strict the same build succeeds and records the problem
    bundle = _build(tmp_path, fx.attention(rank=3), "attn3", target, precision="fp16")
    assert bundle.manifest.sections["engine"]["attention"][0]["to"] == "body"


@pytest.mark.parametrize("target", TARGETS)
def test_strict_fails_when_attention_was_not_fused(tmp_path, target):
    # --strict fails in the fuse-attention pass, before any engine is built, naming the block and why
    with pytest.raises(StrictModeError, match="left unfused; first: MatMul -> ctx: the score scale"):
        _build(tmp_path, fx.plain_softmax_attention(), "plain", target, precision="fp16", strict=True)


@pytest.mark.parametrize("target", TARGETS)
def test_strict_fails_when_fp8_did_not_happen(tmp_path, target):
    with pytest.raises(StrictModeError, match="no compute layer runs in FP8"):
        _build(tmp_path, fx.mlp(), "mlp8", target, precision="fp8", strict=True)


def test_precision_the_target_lacks_is_refused_with_the_reason(tmp_path, runner):
    path = _save(fx.mlp(), tmp_path, "mlp")
    result = runner.invoke(cli, ["build", str(path), "--target", "orin-agx", "--precision", "fp8", "--strict"])
    assert result.exit_code == 2
    assert "target 'orin-agx' has no fp8 support" in result.stderr


@pytest.mark.rtx
@pytest.mark.skipif(not has("tensorrt_rtx"), reason="needs tensorrt-rtx")
def test_fp16_on_old_opset_qdq_is_refused(tmp_path):
    with pytest.raises(BuildError, match="needs opset >= 19"):
        _build(tmp_path, fx.int8_qdq(opset=13), "w8a8_13", "rtx", precision="fp16")
    assert not (tmp_path / "w8a8_13.edgeattn").exists()


@pytest.mark.rtx
@pytest.mark.skipif(not has("tensorrt_rtx"), reason="needs tensorrt-rtx")
def test_int8_opset13_fp32_and_timing_cache_reuse(tmp_path):
    first = _build(tmp_path, fx.int8_qdq(opset=13), "a", "rtx")
    second = _build(tmp_path, fx.int8_qdq(opset=13), "b", "rtx")
    assert {r["precision"] for r in _compute_rows(first)} == {"int8"}
    cache = first.manifest.sections["engine"]["timing_cache"]
    assert Path(cache["path"]).is_file() and cache["path"].startswith(str(tmp_path))
    assert not cache["reused"] and second.manifest.sections["engine"]["timing_cache"]["reused"]


@pytest.mark.rtx
@pytest.mark.skipif(not has("tensorrt_rtx"), reason="needs tensorrt-rtx")
def test_cli_build_rtx(tmp_path, runner):
    path = _save(fx.attention(), tmp_path, "attn")
    result = runner.invoke(cli, ["build", str(path), "--target", "rtx", "--precision", "fp16", "--seq", "1:8:32",
                                 "--strict"])
    assert result.exit_code == 0, result.output
    assert "artifact model.engine" in result.stdout
