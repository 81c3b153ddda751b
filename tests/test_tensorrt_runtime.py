"""The TensorRT runtime backend: GPU check before anything is loaded, routing from a bundle, light imports.

Running an engine needs a GPU the engine was built for; that test skips with the reason here (no GPU)
and on the lent H200 (no TensorRT; TensorRT for RTX engines refuse sm_90).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest

import trt_fixtures as fx
from edgeattn.bundle.build import BuildConfig, build
from edgeattn.errors import RuntimeBackendError
from edgeattn.runtime.backends import open_backend
from edgeattn.runtime.backends.tensorrt import TensorRTBackend, cuda_device
from onnx_fixtures import has

needs_rtx = pytest.mark.skipif(not has("tensorrt_rtx"), reason="needs tensorrt-rtx")


@pytest.fixture
def rtx_bundle(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEATTN_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "attn.onnx"
    onnx.save(fx.attention(), str(path))
    return build(path, BuildConfig(target="rtx", precision="fp16", seq=(1, 8, 32)))


@pytest.mark.rtx
@needs_rtx
def test_open_backend_routes_rtx_bundles(rtx_bundle):
    backend = open_backend(rtx_bundle)
    assert isinstance(backend, TensorRTBackend) and backend.name == "tensorrt_rtx"
    assert backend.plugin is True and 89 in backend.compute_capabilities and 90 not in backend.compute_capabilities


@pytest.mark.rtx
@needs_rtx
@pytest.mark.skipif(cuda_device() is not None, reason="checks the refusal on a machine without a GPU")
def test_activate_without_gpu_refuses_before_loading_anything(rtx_bundle):
    code = ("import sys\nfrom edgeattn.bundle.folder import open_bundle\nfrom edgeattn.runtime.backends import open_backend\n"
            f"b = open_backend(open_bundle({str(rtx_bundle.path)!r}))\n"
            "try:\n    b.activate()\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
            "print('loaded:', sorted(m for m in sys.modules if m.startswith('tensorrt')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr  # the process survives
    assert "RuntimeBackendError no CUDA device" in out.stdout and "loaded: []" in out.stdout


def test_infer_before_activate_and_bad_library(tmp_path):
    with pytest.raises(RuntimeBackendError, match="not active"):
        TensorRTBackend(tmp_path / "x.engine").infer({})
    with pytest.raises(RuntimeBackendError, match="expected one of"):
        TensorRTBackend(tmp_path / "x.engine", library="tvm")


def test_backend_module_imports_nothing_heavy():
    code = ("import sys, edgeattn.runtime.backends.tensorrt, edgeattn.runtime.backends\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorrt', 'tensorrt_rtx', 'torch', 'cuda')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _runnable() -> str | None:
    dev = cuda_device()
    if dev is None:
        return "needs an NVIDIA GPU"
    if dev[0] * 10 + dev[1] not in (75, 80, 86, 89, 120, 121):
        return f"TensorRT for RTX engines refuse SM{dev[0]}{dev[1]}"
    return None


@pytest.mark.gpu
@pytest.mark.rtx
@needs_rtx
@pytest.mark.skipif(_runnable() is not None, reason=str(_runnable()))
def test_engine_matches_onnxruntime_on_gpu(rtx_bundle):
    import onnxruntime as ort

    feeds = {"x": np.random.default_rng(0).standard_normal((2, 8, fx.HIDDEN)).astype(np.float32),
             "window": np.array(0, np.int64)}
    want = ort.InferenceSession(str(rtx_bundle.file("model.onnx"))).run(None, feeds)[0]
    with open_backend(rtx_bundle) as backend:
        got = backend.infer(feeds)["y"]
        again = backend.infer(feeds)["y"]  # the CUDA graph replay
    np.testing.assert_allclose(got, want, atol=2e-2)
    np.testing.assert_array_equal(got, again)
