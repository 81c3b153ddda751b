"""Triton Python-backend model for bundles that Triton's own backends cannot load: TensorRT for RTX engines
(whose attention plugin is Python), and cpu (ONNX Runtime) bundles for servers without an onnxruntime backend
(`--cpu-backend python`). `edgeattn export-triton` copies this file as `<version>/model.py` with the bundle in
`<version>/bundle/` and `edgeattn_environment.py` beside it. It runs inside Triton only
(`triton_python_backend_utils`).

A bundle's attention window (a scalar in the graph, `attention_window` in cpu bundles) is an optional input of
the same name, one value per row (`[rows, 1]`); a request that leaves it out runs with the config's
`edgeattn_window` parameter (0: full attention). The requests Triton's dynamic batcher hands over are run as
batches of one window each (`edgeattn.tritonserver.window_batches`).
"""

from __future__ import annotations

import edgeattn_environment  # noqa: I001  (first: puts the model's environment on sys.path)

edgeattn_environment.use(__file__)

import json  # noqa: E402
from pathlib import Path  # noqa: E402

class TritonPythonModel:
    def initialize(self, args):
        from edgeattn.bundle.folder import open_bundle
        from edgeattn.runtime.backends import open_backend
        from edgeattn.tritonserver.window_batches import WINDOW_PARAMETER

        config = json.loads(args["model_config"])
        folder = Path(args["model_repository"]) / args["model_version"] / "bundle"
        bundle = open_bundle(folder)
        self.output_names = [o["name"] for o in config["output"]]
        self.batched = int(config.get("max_batch_size", 0)) > 0
        self.window_spec = bundle.manifest.input("window")
        self.default_window = int(config.get("parameters", {}).get(WINDOW_PARAMETER, {}).get("string_value", 0))
        self.backend = open_backend(bundle)
        self.backend.activate()
        window_name = self.window_spec.name if self.window_spec is not None else None
        self.input_names = [n for n in self.backend.input_names if n != window_name]

    def _pending(self, request):
        import triton_python_backend_utils as pb_utils

        from edgeattn.errors import InputError
        from edgeattn.tritonserver.window_batches import Pending, request_window

        feeds = {}
        for name in self.input_names:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is None:
                raise InputError(f"missing input {name!r}: expected {self.input_names}")
            feeds[name] = tensor.as_numpy()
        spec = self.window_spec
        window = pb_utils.get_input_tensor_by_name(request, spec.name) if spec is not None else None
        return Pending(feeds, request_window(None if window is None else window.as_numpy(), self.default_window))

    def _infer(self, feeds, window):
        import numpy as np

        spec = self.window_spec
        if spec is not None:  # the graph's window: a scalar (or [1]) of the bundle's dtype
            shape = tuple(d if isinstance(d, int) else 1 for d in spec.dims)
            feeds = {**feeds, spec.name: np.full(shape, window, dtype=spec.dtype)}
        return self.backend.infer(feeds)

    def execute(self, requests):
        import numpy as np
        import triton_python_backend_utils as pb_utils

        from edgeattn.tritonserver.window_batches import run

        pending = []
        for request in requests:
            try:
                pending.append(self._pending(request))
            except Exception as exc:  # noqa: BLE001  (this request's error, sent back to it)
                pending.append(exc)
        responses = []
        for result in run(pending, self._infer, self.batched):  # one response per request, in order
            if isinstance(result, Exception):
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(result))))
            else:
                tensors = [pb_utils.Tensor(name, np.ascontiguousarray(result[name])) for name in self.output_names]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses

    def finalize(self):
        self.backend.deactivate()
