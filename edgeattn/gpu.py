"""The one place that asks whether there is an NVIDIA GPU, and which torch device a stage runs on.

`detect_gpu` loads no CUDA library (it asks nvidia-smi, or the Jetson's device tree), so the build, the
target resolution and the TensorRT worker can call it cheaply. `resolve_device` is for the PyTorch stages
(quantize, sparsify, distill-text): it imports torch and checks that a requested CUDA device exists.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from edgeattn.errors import ConfigError

JETSON_RELEASE = Path("/etc/nv_tegra_release")  # present on every L4T / JetPack system
JETSON_MODEL = Path("/proc/device-tree/model")  # e.g. "NVIDIA Jetson AGX Orin Developer Kit"


def detect_gpu() -> str | None:
    """Name of the first NVIDIA GPU, or None. Loads no CUDA library."""
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        try:
            out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=10, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        if out:
            return out.splitlines()[0]
    if JETSON_RELEASE.is_file() and JETSON_MODEL.is_file():  # Jetson: nvidia-smi may be missing or empty
        return JETSON_MODEL.read_text(errors="replace").strip("\x00 \n") or None
    return None


def torch_cuda_available() -> bool:
    """True when PyTorch is installed with CUDA and sees a device (imports torch)."""
    from edgeattn.optional import require

    return bool(require("torch", "running on a GPU").cuda.is_available())


def check_device_name(device: str, *, auto: bool = False) -> str:
    """`device` when it is cpu, cuda or cuda:N (or auto, where allowed); otherwise ConfigError."""
    ok = device in ("cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit()) \
        or (auto and device == "auto")
    if not ok:
        raise ConfigError(f"device: expected {'auto, ' if auto else ''}cpu, cuda or cuda:N, found {device!r}")
    return device


def resolve_device(device: str = "auto") -> str:
    """The torch device string a stage runs on: auto -> cuda:LOCAL_RANK when CUDA is available, else cpu;
    cuda or cuda:N -> itself, after checking that CUDA is available (ConfigError otherwise)."""
    check_device_name(device, auto=True)
    if device == "cpu":
        return device
    if device == "auto":
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if torch_cuda_available() else "cpu"
    if not torch_cuda_available():
        raise ConfigError(f"device {device}: expected a CUDA device, found none (torch.cuda.is_available() is False)")
    return device
