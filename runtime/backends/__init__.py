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


def open_backend(bundle, *, threads: int = 0) -> Backend:
    """The backend for a bundle's manifest (`backend` field).

    `threads` (intra-op threads, 0: the runtime's default) is an ONNX Runtime setting; TensorRT engines have
    none, so a non-zero value for an engine bundle is refused rather than dropped."""
    from edgeattn.errors import ConfigError, RuntimeBackendError

    kind = bundle.manifest.backend
    if kind == "onnxruntime":
        from edgeattn.runtime.backends.onnxruntime import OnnxRuntimeBackend

        return OnnxRuntimeBackend(bundle.artifact, threads=threads)
    if kind in ("tensorrt_rtx", "tensorrt"):
        from edgeattn.runtime.backends.tensorrt import TensorRTBackend

        if threads:
            raise ConfigError(f"threads: applies to ONNX Runtime bundles only, found {threads} for a {kind} bundle "
                              "(leave --threads out)")
        engine = bundle.manifest.sections.get("engine", {})
        sms = tuple(int(s[2:]) for s in engine.get("applied", {}).get("compute_capabilities", []))
        plugin = any(a.get("to") == "plugin" for a in engine.get("attention", []))
        return TensorRTBackend(bundle.artifact, library=kind, compute_capabilities=sms, plugin=plugin)
    raise RuntimeBackendError(f"no runtime backend for {kind!r}: expected onnxruntime, tensorrt_rtx or tensorrt")
