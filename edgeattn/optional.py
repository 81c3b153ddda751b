"""Lazy imports of heavy optional dependencies, failing with an install hint when missing."""

from __future__ import annotations

import importlib
from types import ModuleType

from edgeattn.errors import MissingDependencyError

# module -> (pip extra of edgeattn, or a plain install command, what needs it)
_HINTS: dict[str, str] = {
    "torch": "pip install 'edgeattn[torch]'  (CPU: pip install torch==2.13.0)",
    "transformers": "pip install 'edgeattn[torch]'",
    "gguf": "pip install 'edgeattn[torch]'",
    "tensorrt_rtx": "pip install 'edgeattn[rtx]'  (tensorrt-rtx==1.7.1.116)",
    "tensorrt": "install TensorRT from JetPack (Jetson) or NVIDIA's CUDA repository (x86-64)",
    "triton": "pip install 'edgeattn[kernels]'",
    "cuda": "pip install cuda-python",
    "prometheus_client": "pip install 'edgeattn[serve]'",
    "matplotlib": "pip install 'edgeattn[plots]'",
    "tritonclient": "pip install 'tritonclient[http]'",
}


def require(module: str, purpose: str = "") -> ModuleType:
    """Import `module` or raise MissingDependencyError naming what needs it and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        root = module.split(".")[0]
        hint = _HINTS.get(root, f"pip install {root}")
        needed = f" for {purpose}" if purpose else ""
        raise MissingDependencyError(f"{root} is needed{needed} but is not installed ({exc}); install with: {hint}") from exc


def available(module: str) -> bool:
    """True when `module` can be imported (looks it up without importing it)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
