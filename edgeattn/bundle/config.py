"""What `edgeattn build` is asked to do, and the checks of its inputs that need no model library.

Light on purpose (no onnxruntime, onnx_ir or torch): the CLI validates a build here before it loads anything,
so a missing model or an unusable `--out` is reported at once."""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from edgeattn.bundle.folder import is_bundle
from edgeattn.bundle.manifest import check_model_name
from edgeattn.errors import BundleError, ConfigError, InputError, ModelError
from edgeattn.shapes import Range, check_range

FLOAT_PRECISIONS = ("fp32", "fp16", "bf16", "fp8")


@dataclass(frozen=True)
class BuildConfig:
    """How to build a bundle. Validated on construction."""

    target: str = "auto"
    out: Path | None = None
    precision: str = "fp32"  # float type of layers the graph does not already quantize
    batch: Range = (1, 1, 8)
    seq: Range | None = None  # None: (1, 128, 512); a decoder's chunk length: (1, 1, its ring's size)
    dims: tuple[tuple[str, Range], ...] = ()  # per-dimension overrides, by dim name
    passes: tuple[str, ...] | None = None  # None: the target's whole build plan; else these passes of it
    strict: bool = False  # fail when a requested fusion or precision did not happen
    parity: bool = True  # compare the built artifact with the source model where it can run here
    parity_tolerance: float | None = None  # relative: max abs diff / max abs reference output (None: the default)
    name: str | None = None
    attention_body: str = "auto"  # auto | blocked | dense: the op's ONNX body (passes/attention_body.py)
    as_inference: bool = False  # a training-mode export: remove Dropout instead of refusing (passes/inference_mode.py)
    cached_attention: str = "ops"  # ops | fused: a cpu decoder's cached attention (passes/cached_attention_cpu.py)
    fast_path: bool = True  # cpu decoders: also the fast path graph, for streams still inside their window

    def __post_init__(self) -> None:
        if self.attention_body not in ("auto", "blocked", "dense"):
            raise ConfigError(f"attention_body: expected auto, blocked or dense, found {self.attention_body!r}")
        if self.cached_attention not in ("ops", "fused"):
            raise ConfigError(f"cached_attention: expected ops or fused, found {self.cached_attention!r}")
        if self.precision not in FLOAT_PRECISIONS:
            raise ConfigError(f"precision: expected one of {', '.join(FLOAT_PRECISIONS)}, found {self.precision!r}")
        check_range(self.batch, "batch")
        if self.seq is not None:
            check_range(self.seq, "seq")
        for name, r in self.dims:
            check_range(r, f"dimension {name}")
        if self.name is not None:
            try:
                check_model_name(self.name, "name")
            except BundleError as exc:
                raise ConfigError(str(exc)) from None
        if self.parity_tolerance is not None and not self.parity_tolerance > 0:
            raise ConfigError(f"parity_tolerance: expected > 0, found {self.parity_tolerance}")

    def as_dict(self) -> dict:
        d = asdict(self)
        d["out"] = str(self.out) if self.out else None
        d["dims"] = {k: list(v) for k, v in self.dims}
        return d


def name_from(model_path: Path) -> str:
    """The file's stem made into a plain model name (it becomes a folder and URL part when served)."""
    name = re.sub(r"[^A-Za-z0-9_.+-]", "_", Path(model_path).stem).lstrip(".-")[:200]
    return name or "model"


def default_bundle_path(model_path: Path) -> Path:
    """MODEL.onnx -> MODEL.edgeattn/ beside it."""
    model_path = Path(model_path)
    return model_path.with_name(model_path.stem + ".edgeattn")


def check_model_file(model_path: Path) -> None:
    if not model_path.exists():
        raise ModelError(f"model file not found: {model_path}")
    if not model_path.is_file():
        raise ModelError(f"expected an ONNX file, found a directory: {model_path}")
    if not os.access(model_path, os.R_OK):
        raise ModelError(f"{model_path}: expected a readable ONNX file, found one this user cannot read")


def check_output(out: Path, model_path: Path) -> None:
    """Refuse, before any work, an output that would replace the input, a folder we did not write, or a
    place this user cannot write."""
    out_abs, model_abs = Path(out).resolve(), Path(model_path).resolve()
    if out_abs == model_abs or out_abs in model_abs.parents:
        raise InputError(f"--out {out}: expected a folder that does not contain the model, found that it "
                         f"holds {model_path}; a build never replaces its own input")
    if out_abs.exists() and not is_bundle(out_abs):
        kind = "a folder that is not an edgeattn bundle" if out_abs.is_dir() else "a file"
        raise InputError(f"--out {out}: expected a new path or an earlier edgeattn bundle, found {kind}; "
                         f"choose another --out or remove it yourself")
    parent = next((p for p in out_abs.parents if p.exists()), None)
    if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"--out {out}: expected a place this user can write, found {parent} "
                         f"{'is not a folder' if parent and not parent.is_dir() else 'is read-only'}")


def check_inputs(model_path: Path, config: BuildConfig) -> Path:
    """Everything about a build's files that can be checked before a model is read; the output folder."""
    model_path = Path(model_path)
    check_model_file(model_path)
    out = Path(config.out) if config.out else default_bundle_path(model_path)
    check_output(out, model_path)
    return out
