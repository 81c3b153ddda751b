"""The runtime backend protocol: an explicit lifecycle, GPU (or heavy libraries) touched only once activated."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Backend(Protocol):
    """Runs one bundle. `activate` loads it, `infer` runs it, `deactivate` frees it."""

    name: str

    def activate(self) -> None: ...

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def deactivate(self) -> None: ...


def open_backend(bundle, **options) -> Backend:
    """The backend for a bundle's manifest (`backend` field)."""
    from edgeattn.errors import RuntimeBackendError

    kind = bundle.manifest.backend
    if kind == "onnxruntime":
        from edgeattn.runtime.backends.onnxruntime import OnnxRuntimeBackend

        return OnnxRuntimeBackend(bundle.artifact, **options)
    if kind in ("tensorrt_rtx", "tensorrt"):
        from edgeattn.runtime.backends.tensorrt import TensorRTBackend

        engine = bundle.manifest.sections.get("engine", {})
        sms = tuple(int(s[2:]) for s in engine.get("applied", {}).get("compute_capabilities", []))
        plugin = any(a.get("to") == "plugin" for a in engine.get("attention", []))
        return TensorRTBackend(bundle.artifact, library=kind, compute_capabilities=sms, plugin=plugin, **options)
    raise RuntimeBackendError(f"no runtime backend for {kind!r}: expected onnxruntime, tensorrt_rtx or tensorrt")
