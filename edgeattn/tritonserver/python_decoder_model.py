"""Triton Python-backend model for decoder bundles: decoupled, so a request gets its text as it is generated
(Triton's generate extension: POST /v2/models/{name}/generate_stream answers with server-sent events).

`edgeattn export-triton` copies this file as `<version>/model.py` with the bundle in `<version>/bundle/` and
`edgeattn_environment.py` beside it. Inputs: `text_input` (the prompt) and the optional `max_tokens`,
`temperature`, `top_p`, `top_k`, `seed`, `window` (0: the whole ring), `attention_budget` (cache rows read at
most: sinks + a recent window + retrieval pages, split by the default share; not with `window`) and `stop`; each
response carries `text_output` (the new text), `token_ids` (the tokens generated since the previous response),
`window` (the attention window it ran with), `attention_budget` (the rows its last token read at most) and
`finish_reason` ("" until the last response: "stop" or "length").
It runs `edgeattn.runtime.generation.generator.Generator`; an instance serves one request at a time
(more instances: `--instances`). A cuda bundle opens on the GPU of its instance (`KIND_GPU`: Triton's
`model_instance_device_id`). It runs inside Triton only (`triton_python_backend_utils`).
"""

from __future__ import annotations

import edgeattn_environment  # noqa: I001  (first: puts the model's environment on sys.path)

edgeattn_environment.use(__file__)

from pathlib import Path  # noqa: E402

OPTIONS = {"max_tokens": int, "temperature": float, "top_p": float, "top_k": int, "seed": int, "window": int,
           "attention_budget": int}


def _scalar(request, name, kind):
    import triton_python_backend_utils as pb_utils

    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    values = tensor.as_numpy().reshape(-1)
    if values.size != 1:
        raise ValueError(f"{name}: expected one value, found {values.size}")
    return kind(values[0])


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def generation_config(request):
    """GenerationConfig from the request's optional inputs (the defaults where one is absent)."""
    import triton_python_backend_utils as pb_utils

    from edgeattn.runtime.generation.generator import GenerationConfig
    from edgeattn.runtime.generation.sampling import SamplingConfig

    given = {name: v for name, kind in OPTIONS.items() if (v := _scalar(request, name, kind)) is not None}
    stop = pb_utils.get_input_tensor_by_name(request, "stop")
    stops = tuple(_text(s) for s in stop.as_numpy().reshape(-1)) if stop is not None else ()
    sampling = SamplingConfig(**{k: given[k] for k in ("temperature", "top_p", "top_k", "seed") if k in given})
    budget = {"budget": given["attention_budget"]} if "attention_budget" in given else {}
    return GenerationConfig(sampling=sampling, stop=stops, **budget,
                            **{k: given[k] for k in ("max_tokens", "window") if k in given})


def instance_device(args) -> str:
    """The torch device of this model instance: `cuda:N` for a GPU instance (N: Triton's device id), else the
    current CUDA device."""
    if str(args.get("model_instance_kind", "")).upper() in ("GPU", "KIND_GPU"):
        return f"cuda:{int(args.get('model_instance_device_id') or 0)}"
    return "cuda"


def open_model(folder: Path, args):
    """The engine's backend for the bundle in `folder`: a cuda bundle on this instance's GPU, else its own."""
    from edgeattn.bundle.folder import open_bundle
    from edgeattn.runtime.cuda.bundle import is_cuda_bundle, open_cuda_decoder
    from edgeattn.runtime.generation.decoder_bundle import open_decoder

    bundle = open_bundle(folder)
    if is_cuda_bundle(bundle):
        return open_cuda_decoder(bundle, device=instance_device(args))
    return open_decoder(bundle)


class TritonPythonModel:
    def initialize(self, args):
        from edgeattn.runtime.generation.generator import Generator

        folder = Path(args["model_repository"]) / args["model_version"] / "bundle"
        self.generator = Generator(open_model(folder, args))
        self.generator.model.activate()

    def _response(self, text, tokens, window, budget, finish_reason=""):
        import numpy as np
        import triton_python_backend_utils as pb_utils

        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_)),
            pb_utils.Tensor("token_ids", np.array(tokens, dtype=np.int64)),
            pb_utils.Tensor("window", np.array([window], dtype=np.int32)),
            pb_utils.Tensor("attention_budget", np.array([budget], dtype=np.int32)),
            pb_utils.Tensor("finish_reason", np.array([finish_reason.encode("utf-8")], dtype=np.object_))])

    def _generate(self, request, sender):
        """Stream one request: a response per text chunk, the last one (flagged final) with the finish reason."""
        import triton_python_backend_utils as pb_utils

        from edgeattn.runtime.generation.generator import GenerationResult

        text_input = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)
        if text_input.size != 1:
            raise ValueError(f"text_input: expected one prompt, found {text_input.size}")
        config = generation_config(request)
        result = GenerationResult("", [], "length", 0, 0, [])
        held, sent = None, 0  # one chunk is held back, so that the last one can carry the final flag
        for chunk in self.generator.stream(_text(text_input[0]), config, result=result):
            if held is not None:
                sender.send(self._response(*held))
            held, sent = (chunk.text, result.tokens[sent:], chunk.window, chunk.budget), len(result.tokens)
        text, tokens, window, budget = held or ("", [], result.windows[-1] if result.windows else config.window,
                                                result.budgets[-1] if result.budgets else 0)
        sender.send(self._response(text, tokens + result.tokens[sent:], window, budget, result.finish_reason),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def execute(self, requests):
        import triton_python_backend_utils as pb_utils

        for request in requests:  # an error belongs to its own request and ends only its stream
            sender = request.get_response_sender()
            try:
                self._generate(request, sender)
            except Exception as exc:
                sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc))),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    def finalize(self):
        self.generator.model.deactivate()
