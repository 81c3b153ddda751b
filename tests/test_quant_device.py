"""One GPU detection (edgeattn.gpu): nvidia-smi's answer without loading CUDA, and the device the torch
stages run on, with a clear error for a CUDA device that is not there."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from edgeattn import gpu, targets
from edgeattn.errors import ConfigError


def _fake_smi(folder, script: str):
    path = folder / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return folder


def test_detect_gpu_reads_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(_fake_smi(tmp_path, 'echo "NVIDIA H200"; echo "NVIDIA H200"')))
    assert gpu.detect_gpu() == "NVIDIA H200"
    assert targets.detect_gpu is gpu.detect_gpu  # the build's target resolution asks the same function


def test_detect_gpu_is_none_when_nvidia_smi_fails_or_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu, "JETSON_RELEASE", tmp_path / "no-such-file")
    monkeypatch.setenv("PATH", str(_fake_smi(tmp_path, "echo 'NVIDIA-SMI has failed' >&2; exit 9")))
    assert gpu.detect_gpu() is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert gpu.detect_gpu() is None


def test_detect_gpu_names_a_jetson_from_its_device_tree(tmp_path, monkeypatch):
    (tmp_path / "release").write_text("# R36 (release), REVISION: 4.0\n")
    (tmp_path / "model").write_bytes(b"NVIDIA Jetson AGX Orin Developer Kit\x00")
    monkeypatch.setattr(gpu, "JETSON_RELEASE", tmp_path / "release")
    monkeypatch.setattr(gpu, "JETSON_MODEL", tmp_path / "model")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert gpu.detect_gpu() == "NVIDIA Jetson AGX Orin Developer Kit"


def test_device_names_are_checked_without_torch():
    for ok in ("cpu", "cuda", "cuda:1"):
        assert gpu.check_device_name(ok) == ok
    with pytest.raises(ConfigError, match="expected cpu, cuda or cuda:N, found 'gpu'"):
        gpu.check_device_name("gpu")
    with pytest.raises(ConfigError, match="expected auto, cpu, cuda or cuda:N, found 'cuda:x'"):
        gpu.check_device_name("cuda:x", auto=True)
    assert gpu.resolve_device("cpu") == "cpu"


def test_resolve_device_without_torch_for_cpu():
    import subprocess

    code = "import sys; from edgeattn.gpu import resolve_device; resolve_device('cpu'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
    assert out.stdout.strip() == "False"


@pytest.mark.torch
def test_auto_and_cuda_follow_torch():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        assert gpu.resolve_device("auto").startswith("cuda:") and gpu.resolve_device("cuda") == "cuda"
    else:
        assert gpu.resolve_device("auto") == "cpu"
        with pytest.raises(ConfigError, match="device cuda:0: expected a CUDA device, found none"):
            gpu.resolve_device("cuda:0")
