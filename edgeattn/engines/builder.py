"""Engine builders, one per backend, chosen by the target's `backend` and loaded lazily."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import onnx_ir as ir

from edgeattn.errors import TargetError
from edgeattn.onnx_model import Signature
from edgeattn.shapes import ShapePlan
from edgeattn.targets import Target


@dataclass(frozen=True)
class EngineJob:
    """What an engine builder is handed: the processed model in memory and its signature, and the same model
    written once to `model_path` for the libraries that read a file (ONNX Runtime, the TensorRT parser).

    The builder may change `model` (the build has written it and reads it no more)."""

    model: ir.Model
    model_path: Path
    signature: Signature
    staging: Path  # the bundle being written: the artifact goes here
    target: Target
    precision: str  # the requested float type (BuildConfig.precision)
    shape_plan: ShapePlan
    weights_file: str | None = None  # an ONNX artifact's weights in this side file, for other graphs to share


@dataclass
class ArtifactResult:
    """What an engine builder produced: the file the runtime loads, and what it knows about it."""

    artifact: str
    toolchain: dict[str, str]
    details: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    precision: dict[str, Any] | None = None  # replaces the graph-level summary when the builder knows better
    parity_possible: bool = True  # False when the artifact cannot run here (no GPU)


# builder(job: EngineJob) -> ArtifactResult
BUILDERS: dict[str, str] = {
    "onnxruntime": "edgeattn.engines.onnxruntime:build_artifact",
    "tensorrt_rtx": "edgeattn.engines.tensorrt.builder:build_artifact",
    "tensorrt": "edgeattn.engines.tensorrt.builder:build_artifact",
}


def builder_for(backend: str) -> Callable[..., ArtifactResult]:
    try:
        module, attr = BUILDERS[backend].split(":")
    except KeyError:
        raise TargetError(f"no engine builder for backend {backend!r} yet: expected one of {', '.join(BUILDERS)}") from None
    return getattr(importlib.import_module(module), attr)
