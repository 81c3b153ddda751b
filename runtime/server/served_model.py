"""One bundle as the service sees it: its client-facing signature, request validation, batch axes, metadata."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgeattn.bundle.folder import Bundle
from edgeattn.onnx_model import TensorSpec
from edgeattn.runtime.server.kserve import ProtocolError, datatype_of
from edgeattn.runtime.server.vocabulary import index_limits

VERSION = "1"
PLATFORMS = {"onnxruntime": "onnxruntime_onnx", "tensorrt": "tensorrt_plan", "tensorrt_rtx": "tensorrt_plan"}


def _batch_axis(spec: TensorSpec, batch_dims: set[str]) -> int | None:
    return next((i for i, d in enumerate(spec.dims) if d in batch_dims), None)


def longest_sequence(bundle: Bundle) -> int:
    """The largest size of the bundle's sequence dimensions (0 when it has none): the largest useful window."""
    kinds = bundle.manifest.sections.get("dimension_kinds", {})
    return max((r[2] for d, r in bundle.manifest.shape_ranges.items() if kinds.get(d) == "seq"), default=0)


@dataclass
class ServedModel:
    """A bundle's signature as seen by clients. The `window` input is fed by the server, never by clients."""

    name: str
    bundle: Bundle

    def __post_init__(self) -> None:
        m = self.bundle.manifest
        kinds = m.sections.get("dimension_kinds", {})
        self.batch_dims = {d for d, k in kinds.items() if k == "batch"}
        self.window_input = m.input("window")
        self.inputs = [s for s in m.inputs if s.role != "window"]
        self.outputs = list(m.outputs)
        self.input_axes = {s.name: _batch_axis(s, self.batch_dims) for s in self.inputs}
        self.output_axes = {s.name: _batch_axis(s, self.batch_dims) for s in self.outputs}
        batch_ranges = [m.shape_ranges[d] for d in self.batch_dims if d in m.shape_ranges]
        self.max_batch = min((r[2] for r in batch_ranges), default=1)
        # Requests can be stacked only when every input and output has the batch axis first.
        self.batchable = bool(self.batch_dims) and all(
            a == 0 for a in list(self.input_axes.values()) + list(self.output_axes.values()))
        # integer inputs that index a table (token ids, token types, positions): ids must lie in 0..rows-1
        self.index_rows = {n: r for n, r in index_limits(self.bundle).items()
                           if any(s.name == n for s in self.inputs)}
        self.index_inputs = {s.name for s in self.inputs if s.role == "token_ids" or s.name in self.index_rows}

    def validate(self, inputs: dict[str, np.ndarray], outputs: list[str] | None) -> int:
        """Check names, datatypes, ranks and sizes against the bundle; return the request's batch rows."""
        expected = {s.name: s for s in self.inputs}
        if self.window_input is not None and self.window_input.name in inputs:
            raise ProtocolError(f"input {self.window_input.name!r} is the attention window, which the server "
                                f"sets: leave it out (change it with the admin endpoint /v2/admin/window)")
        unknown = sorted(set(inputs) - set(expected))
        if unknown:
            raise ProtocolError(f"model {self.name!r} has no input(s) {unknown}: expected {sorted(expected)}")
        missing = sorted(set(expected) - set(inputs))
        if missing:
            raise ProtocolError(f"missing input(s) {missing} for model {self.name!r}: expected {sorted(expected)}")
        if outputs is not None:
            names = {s.name for s in self.outputs}
            bad = sorted(set(outputs) - names)
            if bad:
                raise ProtocolError(f"model {self.name!r} has no output(s) {bad}: expected {sorted(names)}")
        sizes: dict[str, tuple[int, str]] = {}
        for name, spec in expected.items():
            array = inputs[name]
            want = datatype_of(spec.dtype)
            if array.dtype != np.dtype(spec.dtype):
                raise ProtocolError(f"input {name!r}: expected datatype {want}, found {datatype_of(array.dtype.name)}")
            if array.ndim != len(spec.dims):
                raise ProtocolError(f"input {name!r}: expected {len(spec.dims)} dimensions {list(spec.dims)}, "
                                    f"found shape {list(array.shape)}")
            for axis, (dim, size) in enumerate(zip(spec.dims, array.shape)):
                self._check_dim(name, axis, dim, size, sizes)
            if name in self.index_inputs and array.size:
                self._check_ids(name, array)
        axis_rows = [inputs[n].shape[a] for n, a in self.input_axes.items() if a is not None]
        return axis_rows[0] if axis_rows else 1

    def _check_dim(self, name: str, axis: int, dim, size: int, sizes: dict) -> None:
        if isinstance(dim, int):
            if size != dim:
                raise ProtocolError(f"input {name!r}: expected size {dim} on axis {axis}, found {size}")
            return
        lo, _, hi = self.bundle.manifest.shape_ranges.get(dim, (1, 1, 2**31))
        if not lo <= size <= hi:
            raise ProtocolError(f"input {name!r}: axis {axis} ({dim}) is {size}, expected {lo}..{hi}")
        if dim in sizes and sizes[dim][0] != size:
            other, first = sizes[dim][1], sizes[dim][0]
            raise ProtocolError(f"input {name!r}: axis {axis} ({dim}) is {size} but input {other!r} has {first}")
        sizes.setdefault(dim, (size, name))

    def _check_ids(self, name: str, array: np.ndarray) -> None:
        rows = self.index_rows.get(name)
        low, high = int(array.min()), int(array.max())
        if low < 0 or (rows is not None and high >= rows):
            expected = f"0..{rows - 1} (a table of {rows} rows)" if rows is not None else ">= 0"
            raise ProtocolError(f"input {name!r}: ids must be in {expected}, found {low if low < 0 else high}")

    def _client_dims(self, spec: TensorSpec) -> list[int]:
        return [d if isinstance(d, int) else -1 for d in spec.dims]

    def metadata(self) -> dict:
        def tensor(s: TensorSpec) -> dict:
            return {"name": s.name, "datatype": datatype_of(s.dtype), "shape": self._client_dims(s)}

        m = self.bundle.manifest
        return {"name": self.name, "versions": [VERSION], "platform": PLATFORMS.get(m.backend, m.backend),
                "inputs": [tensor(s) for s in self.inputs], "outputs": [tensor(s) for s in self.outputs],
                "parameters": {"attention_window_input": self.window_input.name if self.window_input else None,
                               "target": m.target.get("name")}}

    def config(self, max_batch: int, max_queue_delay_ms: float, max_queue: int) -> dict:
        """Triton's model configuration (dims exclude the batch axis when max_batch_size > 0)."""
        m = self.bundle.manifest
        batched = self.batchable

        def tensor(s: TensorSpec, axes: dict) -> dict:
            dims = self._client_dims(s)
            if batched:
                dims = dims[1:]
            return {"name": s.name, "data_type": "TYPE_" + datatype_of(s.dtype), "dims": dims}

        config = {"name": self.name, "platform": PLATFORMS.get(m.backend, m.backend), "backend": m.backend,
                  "max_batch_size": self.max_batch if batched else 0,
                  "input": [tensor(s, self.input_axes) for s in self.inputs],
                  "output": [tensor(s, self.output_axes) for s in self.outputs],
                  "parameters": {"attention_window_input": {"string_value": self.window_input.name
                                                            if self.window_input else ""},
                                 "server_max_batch": {"string_value": str(max_batch)}}}
        if batched and max_batch > 1:
            config["dynamic_batching"] = {"max_queue_delay_microseconds": int(max_queue_delay_ms * 1000),
                                          "default_queue_policy": {"max_queue_size": max_queue}}
            config["parameters"]["batching_policy"] = {"string_value": "stack requests of equal non-batch shape"}
        return config
