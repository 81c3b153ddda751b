"""`edgeattn bench` on TensorRT for RTX bundles (issue 19, item 11): it used to pass ONNX Runtime's `threads`
to the TensorRT backend and die with a TypeError on every engine bundle. Without a GPU the expected end is
the backend's clear refusal (exit code 6), reached only after the bundle was verified and inputs were made."""

from __future__ import annotations

import onnx
import pytest

import trt_fixtures as fx
from edgeattn.bench import BenchConfig, run
from edgeattn.bundle.build import BuildConfig, build
from edgeattn.cli.main import cli
from edgeattn.errors import ConfigError, RuntimeBackendError
from edgeattn.runtime.backends.tensorrt import cuda_device
from onnx_fixtures import has

pytestmark = [pytest.mark.rtx,
              pytest.mark.skipif(not has("tensorrt_rtx"), reason="needs tensorrt-rtx"),
              pytest.mark.skipif(cuda_device() is not None, reason="checks the refusal on a machine without a GPU")]


@pytest.fixture(scope="module")
def rtx_bundle(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench_rtx")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGEATTN_CACHE_DIR", str(tmp / "cache"))
        path = tmp / "attn.onnx"
        onnx.save(fx.attention(), str(path))
        return build(path, BuildConfig(target="rtx", precision="fp16", seq=(1, 8, 32), out=tmp / "bundle"))


def test_bench_library_call_ends_in_the_backend_refusal(rtx_bundle):
    with pytest.raises(RuntimeBackendError, match="no CUDA device: TensorRT for RTX engines need an NVIDIA GPU"):
        run(rtx_bundle.path, BenchConfig(iterations=1, window=4))


def test_bench_cli_exits_with_the_backend_error(rtx_bundle, runner):
    result = runner.invoke(cli, ["bench", str(rtx_bundle.path), "--iterations", "1"])
    assert result.exit_code == RuntimeBackendError.exit_code, result.output
    assert "no CUDA device" in result.output and "Traceback" not in result.output


def test_bench_threads_on_an_engine_bundle_is_refused_by_name(rtx_bundle, runner):
    with pytest.raises(ConfigError, match="threads: .*ONNX Runtime bundles.*tensorrt_rtx"):
        run(rtx_bundle.path, BenchConfig(iterations=1, threads=2))
    result = runner.invoke(cli, ["bench", str(rtx_bundle.path), "--threads", "2"])
    assert result.exit_code == ConfigError.exit_code and "--threads" in result.output, result.output
