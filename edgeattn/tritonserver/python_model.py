"""Triton Python-backend model for bundles that Triton's own backends cannot load: TensorRT for RTX engines
(whose attention plugin is Python), and cpu (ONNX Runtime) bundles for servers without an onnxruntime backend
(`--cpu-backend python`). `edgeattn export-triton` copies this file as `<version>/model.py` with the bundle in
`<version>/bundle/` and `edgeattn_environment.py` beside it. It runs inside Triton only
(`triton_python_backend_utils`).
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

        folder = Path(args["model_repository"]) / args["model_version"] / "bundle"
        self.output_names = [o["name"] for o in json.loads(args["model_config"])["output"]]
        self.backend = open_backend(open_bundle(folder))
        self.backend.activate()

    def execute(self, requests):
        import triton_python_backend_utils as pb_utils

        responses = []
        for request in requests:  # one response per request; an error belongs to its own request
            try:
                feeds = {name: pb_utils.get_input_tensor_by_name(request, name).as_numpy()
                         for name in self.backend.input_names}
                outputs = self.backend.infer(feeds)
                tensors = [pb_utils.Tensor(name, outputs[name]) for name in self.output_names]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            except Exception as exc:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc))))
        return responses

    def finalize(self):
        self.backend.deactivate()
