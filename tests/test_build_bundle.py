"""edgeattn build / bench / inspect on ONNX Runtime, with tiny models made in code."""

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edgeattn.bundle.build import BuildConfig, build
from edgeattn.bundle.folder import open_bundle
from edgeattn.cli.main import cli
from edgeattn.errors import BundleError, ConfigError
from edgeattn.bundle.manifest import sha256_file
from edgeattn.sample_inputs import make_inputs


def test_build_writes_a_verified_bundle(tiny_onnx: Path):
    bundle = build(tiny_onnx, BuildConfig(target="cpu"))
    assert bundle.path == tiny_onnx.with_name("tiny.edgeattn")
    m = bundle.manifest
    assert m.target["name"] == "cpu" and m.backend == "onnxruntime"
    assert [i.name for i in m.inputs] == ["input_ids", "attention_mask"]
    assert [i.role for i in m.inputs] == ["token_ids", "mask"]
    assert m.shape_ranges == {"batch": [1, 1, 8], "seq": [1, 128, 512]}
    assert m.sections["parity"]["status"] == "pass"
    assert set(m.files) == {"model.onnx", "model.ort.onnx", "report.md"}
    for name, digest in m.files.items():
        assert sha256_file(bundle.path / name) == digest
    assert m.precision["compute_layers"] == {"float": 1}
    assert "parity" in bundle.report.read_text().lower()
    # no staging folders left beside the bundle
    assert sorted(p.name for p in tiny_onnx.parent.iterdir()) == ["tiny.edgeattn", "tiny.onnx"]


def test_bundle_outputs_match_source(tiny_onnx: Path):
    bundle = build(tiny_onnx, BuildConfig(target="cpu"))
    feeds = make_inputs(bundle.manifest.inputs, {"batch": 3, "seq": 7}, seed=1)
    want = ort.InferenceSession(str(tiny_onnx)).run(None, feeds)[0]
    got = ort.InferenceSession(str(bundle.artifact)).run(None, feeds)[0]
    assert got.shape == (3, 7, 16)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_failed_build_keeps_previous_bundle(tiny_onnx: Path, monkeypatch):
    bundle = build(tiny_onnx, BuildConfig(target="cpu"))
    before = (bundle.path / "manifest.json").read_text()

    def explode(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("edgeattn.engines.onnxruntime.build_artifact", explode)
    with pytest.raises(KeyboardInterrupt):
        build(tiny_onnx, BuildConfig(target="cpu"))
    assert (bundle.path / "manifest.json").read_text() == before
    assert sorted(p.name for p in tiny_onnx.parent.iterdir()) == ["tiny.edgeattn", "tiny.onnx"]


def test_interrupted_first_build_leaves_nothing(tiny_onnx: Path, monkeypatch):
    monkeypatch.setattr("edgeattn.engines.onnxruntime.build_artifact",
                        lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        build(tiny_onnx, BuildConfig(target="cpu"))
    assert [p.name for p in tiny_onnx.parent.iterdir()] == ["tiny.onnx"]


def test_parity_failure_fails_the_build(tiny_onnx: Path, monkeypatch):
    import edgeattn.bundle.parity as parity

    real = parity.compare
    monkeypatch.setattr(parity, "compare", lambda *a, **k: {**real(*a, **k), "max_abs_diff": 1.0})
    with pytest.raises(Exception, match="parity check failed"):
        build(tiny_onnx, BuildConfig(target="cpu"))
    assert not tiny_onnx.with_name("tiny.edgeattn").exists()


def test_config_is_validated():
    with pytest.raises(ConfigError, match="min <= opt <= max"):
        BuildConfig(seq=(8, 4, 16))
    with pytest.raises(ConfigError, match="precision"):
        BuildConfig(precision="int3")


def test_cpu_target_refuses_fp16(tiny_onnx: Path, runner):
    result = runner.invoke(cli, ["build", str(tiny_onnx), "--target", "cpu", "--precision", "fp16"])
    assert result.exit_code == 2
    assert "has no fp16 support" in result.stderr


def test_bench_json_has_percentiles(tiny_onnx: Path, runner):
    build(tiny_onnx, BuildConfig(target="cpu", seq=(1, 8, 16)))
    result = runner.invoke(cli, ["bench", str(tiny_onnx.with_name("tiny.edgeattn")), "--iterations", "5",
                                 "--warmup", "1", "--batch", "2", "--json"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)
    for key in ("p50_ms", "p90_ms", "p99_ms", "mean_ms", "throughput_per_s"):
        assert stats[key] > 0
    assert stats["iterations"] == 5 and stats["sizes"] == {"batch": 2, "seq": 8}
    assert stats["p50_ms"] <= stats["p99_ms"]


def test_bench_refuses_sizes_outside_range(tiny_onnx: Path, runner):
    build(tiny_onnx, BuildConfig(target="cpu", batch=(1, 1, 2)))
    result = runner.invoke(cli, ["bench", str(tiny_onnx.with_name("tiny.edgeattn")), "--batch", "4"])
    assert result.exit_code == 2 and "outside the bundle's range" in result.stderr


def test_inspect_shows_report(tiny_onnx: Path, runner):
    build(tiny_onnx, BuildConfig(target="cpu"))
    result = runner.invoke(cli, ["inspect", str(tiny_onnx.with_name("tiny.edgeattn"))])
    assert result.exit_code == 0
    assert "all files match the manifest" in result.stdout and "Parity" in result.stdout


def test_manifest_round_trips(tiny_onnx: Path):
    from edgeattn.bundle.manifest import Manifest

    m = build(tiny_onnx, BuildConfig(target="cpu")).manifest
    again = Manifest.from_json(m.to_json())
    assert again == m


def test_open_bundle_detects_tampering(tiny_onnx: Path):
    bundle = build(tiny_onnx, BuildConfig(target="cpu"))
    model = onnx.load(str(bundle.artifact))
    model.graph.node[0].name = "tampered"
    onnx.save(model, str(bundle.artifact))
    with pytest.raises(BundleError, match="does not match the manifest"):
        open_bundle(bundle.path)


def test_auto_target_without_gpu_is_cpu(monkeypatch):
    from edgeattn import targets

    monkeypatch.setattr(targets, "detect_gpu", lambda: None)
    target, why = targets.resolve_target("auto")
    assert target.name == "cpu" and "no NVIDIA GPU" in why


def test_a_missing_model_is_said_before_any_model_library_loads(tmp_path):
    """`edgeattn build missing.onnx` checks its paths first: no onnxruntime, onnx_ir or torch is imported."""
    import subprocess
    import sys

    script = ("import sys\nfrom edgeattn.cli.main import cli\ntry:\n    cli(['build', 'missing.onnx'])\n"
              "except SystemExit as exc:\n    code = exc.code\n"
              "print(code, [m for m in ('onnxruntime', 'onnx_ir', 'torch', 'transformers') if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "model file not found: missing.onnx" in proc.stderr
    assert proc.stdout.split() == ["2", "[]"]
