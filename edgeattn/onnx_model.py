"""Load and validate ONNX models, and describe their inputs and outputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import onnx

from edgeattn.errors import ModelError

MIN_OPSET = 13  # per-channel Q/DQ (axis) and the shape ops we rewrite need 13+
MAX_OPSET = 23  # opset 23 brings the standard Attention op

# ONNX element type -> numpy dtype name
_DTYPES = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.BOOL: "bool",
}


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output: name, numpy dtype and dims (ints, or names for dynamic axes)."""

    name: str
    dtype: str
    dims: tuple[int | str, ...]
    role: str = "data"  # data | token_ids | mask | token_type | positions | window

    def as_dict(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "dims": list(self.dims), "role": self.role}

    @classmethod
    def from_dict(cls, d: dict) -> "TensorSpec":
        return cls(d["name"], d["dtype"], tuple(d["dims"]), d.get("role", "data"))

    @property
    def dynamic_dims(self) -> tuple[str, ...]:
        return tuple(d for d in self.dims if isinstance(d, str))


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    opset: int
    domains: dict[str, int] = field(default_factory=dict)


def guess_role(name: str, dtype: str) -> str:
    """Role of a model input, from its name, used to make sensible sample inputs."""
    lowered = name.lower()
    if lowered == "logits_to_keep":
        return "logits_to_keep"
    if "window" in lowered:
        return "window"
    if "mask" in lowered:
        return "mask"
    if "token_type" in lowered or "segment" in lowered:
        return "token_type"
    if "position" in lowered:
        return "positions"
    if dtype.startswith("int") and ("ids" in lowered or "input" in lowered or "token" in lowered):
        return "token_ids"
    return "data"


def load(path: str | Path, *, check: bool = True) -> onnx.ModelProto:
    """Read an ONNX file and validate it; every failure is a ModelError that names the file."""
    path = Path(path)
    if not path.exists():
        raise ModelError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelError(f"expected an ONNX file, found a directory: {path}")
    try:
        model = onnx.load(str(path), load_external_data=True)
    except Exception as exc:  # protobuf raises DecodeError, RuntimeWarning-ish errors and more
        raise ModelError(f"{path} is not a readable ONNX model (truncated or not ONNX): {exc}") from None
    if model.ir_version <= 0 or len(model.graph.node) == 0:
        raise ModelError(f"{path} is not an ONNX model: expected a graph with nodes, found none")
    if check:
        validate(model, str(path))
    return model


def opset_of(model: onnx.ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return entry.version
    raise ModelError("model imports no ai.onnx opset")


def validate(model: onnx.ModelProto, where: str = "model") -> None:
    """onnx.checker, the opset range and the input/output types."""
    opset = opset_of(model)
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ModelError(f"{where}: unsupported opset {opset}: expected {MIN_OPSET} to {MAX_OPSET}")
    try:
        onnx.checker.check_model(model, full_check=False)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0]
        raise ModelError(f"{where} fails the ONNX checker: {first}") from None
    for value in list(model.graph.input) + list(model.graph.output):
        elem = value.type.tensor_type.elem_type
        if not value.type.HasField("tensor_type") or elem not in _DTYPES:
            raise ModelError(f"{where}: {value.name!r} has an unsupported type: expected a tensor of "
                             f"{', '.join(sorted(set(_DTYPES.values())))}")


def _spec(value: onnx.ValueInfoProto, is_input: bool) -> TensorSpec:
    tt = value.type.tensor_type
    dims: list[int | str] = []
    for i, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        else:
            dims.append(d.dim_param or f"{value.name}_dim{i}")
    dtype = _DTYPES[tt.elem_type]
    role = guess_role(value.name, dtype) if is_input else "data"
    return TensorSpec(value.name, dtype, tuple(dims), role)


def signature(model: onnx.ModelProto) -> Signature:
    """Inputs (initializers excluded) and outputs of a model."""
    initializers = {t.name for t in model.graph.initializer}
    inputs = tuple(_spec(v, True) for v in model.graph.input if v.name not in initializers)
    outputs = tuple(_spec(v, False) for v in model.graph.output)
    domains = {e.domain or "ai.onnx": e.version for e in model.opset_import}
    return Signature(inputs, outputs, opset_of(model), domains)
