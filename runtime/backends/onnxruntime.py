"""ONNX Runtime backend: the embedded default, on the CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgeattn.errors import InputError, RuntimeBackendError


class OnnxRuntimeBackend:
    name = "onnxruntime"

    def __init__(self, model_path: str | Path, *, threads: int = 0,
                 providers: tuple[str, ...] = ("CPUExecutionProvider",), optimize: bool = True) -> None:
        self.model_path = Path(model_path)
        self.optimize = optimize  # False: run the graph exactly as written (a reference)
        self.threads = threads
        self.providers = providers
        self._session = None
        self._optional: list[str] | None = None
        self._inputs: list[str] | None = None
        self._outputs: list[str] | None = None

    def activate(self) -> None:
        import onnxruntime as ort

        self._optional = self._inputs = self._outputs = None  # names of the session about to load

        options = ort.SessionOptions()
        level = ort.GraphOptimizationLevel
        options.graph_optimization_level = level.ORT_ENABLE_ALL if self.optimize else level.ORT_DISABLE_ALL
        if self.threads:
            options.intra_op_num_threads = self.threads
        options.log_severity_level = 3
        try:
            self._session = ort.InferenceSession(str(self.model_path), options, providers=list(self.providers))
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise RuntimeBackendError(f"ONNX Runtime could not load {self.model_path}: {exc}") from None

    @property
    def session(self):
        if self._session is None:
            raise RuntimeBackendError("backend is not active: call activate() first")
        return self._session

    @property
    def input_names(self) -> list[str]:
        if self._inputs is None:  # read once per session: infer() asks at every step
            self._inputs = [i.name for i in self.session.get_inputs()]
        return self._inputs

    @property
    def optional_input_names(self) -> list[str]:
        """Inputs with a default (initializers a caller may override, e.g. a decoder's `logits_to_keep`)."""
        if self._optional is None:  # read once per session: infer() asks at every step
            self._optional = [i.name for i in self.session.get_overridable_initializers()]
        return self._optional

    @property
    def output_names(self) -> list[str]:
        if self._outputs is None:
            self._outputs = [o.name for o in self.session.get_outputs()]
        return self._outputs

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = set(self.input_names) - set(feeds)
        if missing:
            raise InputError(f"missing input(s) {sorted(missing)}: expected {self.input_names}")
        try:
            names = self.input_names + [n for n in self.optional_input_names if n in feeds]
            outs = self.session.run(None, {k: feeds[k] for k in names})
        except Exception as exc:
            raise RuntimeBackendError(f"ONNX Runtime failed to run {self.model_path.name}: {exc}") from None
        return dict(zip(self.output_names, outs))

    def deactivate(self) -> None:
        self._session, self._optional, self._inputs, self._outputs = None, None, None, None

    def __enter__(self) -> "OnnxRuntimeBackend":
        self.activate()
        return self

    def __exit__(self, *exc) -> None:
        self.deactivate()
