"""The service's OpenAPI 3.0 description (served at /openapi.json): the KServe v2 inference routes, the
Triton extensions, the admin window routes and the generation routes of decoder bundles (OpenAI-compatible
and Triton's generate), with the request bodies they accept."""

from __future__ import annotations

DATATYPES = ["BOOL", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64", "FP16", "FP32",
             "FP64"]
ERRORS = {"400": "a malformed request", "401": "the admin token is missing or wrong",
          "403": "a cross-origin admin request", "404": "unknown model or version",
          "408": "the body arrived too slowly", "409": "the window is locked",
          "413": "the body is over its bound (max_body_bytes, max_generate_body_bytes), decoded",
          "415": "an admin body that is not JSON, or a Content-Encoding other than gzip, deflate or identity",
          "503": "warming up, queue full or shutting down", "429": "every slot busy and the queue full (Retry-After)"}

_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
_PARAMETERS = {"type": "object", "additionalProperties": True}


def _infer_request(inputs: list[str], outputs: list[str]) -> dict:
    """`inputs`/`outputs`: the served tensor names, as enums (so generated requests can reach a model)."""
    def name(names: list[str]) -> dict:
        return {"type": "string", **({"enum": names} if names else {})}

    tensor = {"type": "object", "required": ["name", "shape", "datatype"], "properties": {
        "name": name(inputs),
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "datatype": {"type": "string", "enum": DATATYPES},
        "parameters": _PARAMETERS,
        "data": {"type": "array", "items": {"anyOf": [{"type": "number"}, {"type": "boolean"}]}}}}
    return {"type": "object", "required": ["inputs"], "properties": {
        "id": {"type": "string"},
        "parameters": _PARAMETERS,
        "inputs": {"type": "array", "minItems": 1, "items": tensor},
        "outputs": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
            "name": name(outputs), "parameters": _PARAMETERS}}}}}
_WINDOW_STATE = {"type": "object", "required": ["window", "locked", "history"], "properties": {
    "window": {"type": "integer"}, "locked": {"type": "boolean"}, "history": {"type": "array"}}}
_WINDOW_BODY = {"type": "object", "properties": {
    "window": {"type": "integer", "minimum": 0}, "reason": {"type": "string"}, "source": {"type": "string"}}}


_OPENAI_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"}, "param": {"type": "string", "nullable": True},
        "code": {"type": "string", "nullable": True}}}}}
_STOP = {"anyOf": [{"type": "string", "maxLength": 256},
                   {"type": "array", "maxItems": 4, "items": {"type": "string", "maxLength": 256}}]}


def _sampling(decoders: list[str]) -> dict:
    """The fields the completions routes read; small bounds on max_tokens keep generated requests short."""
    return {"model": {"type": "string", **({"enum": decoders} if decoders else {})},
            "max_tokens": {"type": "integer", "maximum": 8}, "temperature": {"type": "number"},
            "top_p": {"type": "number"}, "seed": {"type": "integer"}, "n": {"type": "integer"},
            "stop": _STOP, "stream": {"type": "boolean"},
            "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}}}


def _completion_request(decoders: list[str]) -> dict:
    return {"type": "object", "required": ["model", "prompt"], "properties": {
        **_sampling(decoders),
        "prompt": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "integer"}}]}}}


def _chat_request(decoders: list[str]) -> dict:
    message = {"type": "object", "required": ["role", "content"], "properties": {
        "role": {"type": "string", "enum": ["system", "user", "assistant"]}, "content": {"type": "string"}}}
    return {"type": "object", "required": ["model", "messages"], "properties": {
        **_sampling(decoders), "messages": {"type": "array", "items": message}}}


def _generate_request() -> dict:
    return {"type": "object", "required": ["text_input"], "properties": {
        "text_input": {"type": "string"}, "max_tokens": {"type": "integer", "maximum": 8},
        "parameters": {"type": "object", "properties": {
            "max_tokens": {"type": "integer", "maximum": 8}, "temperature": {"type": "number"},
            "top_p": {"type": "number"}, "seed": {"type": "integer"}, "stop": _STOP}}}}


def _openai_answers(*codes: str, stream: bool = True) -> dict:
    content = {"application/json": {"schema": {"type": "object"}}}
    if stream:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    answers = {"200": {"description": "the completion, or server-sent events when stream is true",
                       "content": content}}
    for code in codes:
        answers[code] = {"description": ERRORS[code], "content": {"application/json": {"schema": _OPENAI_ERROR}}}
    return answers


_GENERATION_ERRORS = ("400", "404", "408", "413", "415", "429", "503")


def _generation_paths(decoders: list[str]) -> dict:
    decoder = {"name": "model", "in": "path", "required": True,
               "schema": {"type": "string", **({"enum": decoders} if decoders else {})}}
    generate = {"post": {"parameters": [decoder], "requestBody": _body(_generate_request()),
                         "responses": _answers(None, *_GENERATION_ERRORS)}}
    return {
        "/v1/models": {"get": {"responses": _answers({"type": "object"})}},
        "/v1/completions": {"post": {"requestBody": _body(_completion_request(decoders)),
                                     "responses": _openai_answers(*_GENERATION_ERRORS)}},
        "/v1/chat/completions": {"post": {"requestBody": _body(_chat_request(decoders)),
                                          "responses": _openai_answers(*_GENERATION_ERRORS)}},
        "/v2/models/{model}/generate": generate,
        "/v2/models/{model}/generate_stream": generate,
    }


def _answers(ok: dict | None = None, *codes: str) -> dict:
    answers = {"200": {"description": "OK", "content": {"application/json": {"schema": ok or {"type": "object"}}}}}
    for code in codes:
        answers[code] = {"description": ERRORS[code], "content": {"application/json": {"schema": _ERROR}}}
    return answers


def _body(schema: dict, required: bool = True) -> dict:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


def openapi_document(version: str, models: list[str] | None = None, inputs: list[str] | None = None,
                     outputs: list[str] | None = None, *, decoders: list[str] | None = None) -> dict:
    """The description; `models` (the served names) become the `model` path parameter's enum, `inputs` and
    `outputs` (their tensor names) those of the tensors' names; `decoders` (the decoder bundles' names) the
    model enum of the generation routes."""
    model = {"name": "model", "in": "path", "required": True,
             "schema": {"type": "string", **({"enum": sorted(models)} if models else {})}}
    get_ok = {"get": {"responses": _answers()}}
    model_get = {"get": {"parameters": [model], "responses": _answers(None, "404")}}
    admin = ("400", "401", "403", "415")
    return {
        "openapi": "3.0.3",
        "info": {"title": "edgeattn serve", "version": version,
                 "description": "KServe v2 (Open Inference Protocol) with Triton's binary tensor extension; "
                                "OpenAI-compatible and Triton generate routes for decoder bundles"},
        "paths": {
            "/v2/health/live": get_ok,
            "/v2/health/ready": {"get": {"responses": _answers(None, "503")}},
            "/v2": get_ok,
            "/v2/models/stats": get_ok,
            "/v2/models/{model}": model_get,
            "/v2/models/{model}/ready": {"get": {"parameters": [model], "responses": _answers(None, "404", "503")}},
            "/v2/models/{model}/config": model_get,
            "/v2/models/{model}/stats": model_get,
            "/v2/models/{model}/infer": {"post": {
                "parameters": [model],
                "requestBody": _body(_infer_request(sorted(inputs or []), sorted(outputs or []))),
                "responses": _answers(None, "400", "404", "408", "413", "415", "503")}},
            "/v2/repository/index": {"post": {"responses": _answers({"type": "array"})}},
            "/v2/admin/window": {
                "get": {"responses": _answers(_WINDOW_STATE, "401", "403")},
                "post": {"requestBody": _body(_WINDOW_BODY), "responses": _answers(_WINDOW_STATE, *admin, "409")}},
            "/v2/admin/window/lock": {"post": {"requestBody": _body(_WINDOW_BODY, False),
                                               "responses": _answers(_WINDOW_STATE, *admin)}},
            "/v2/admin/window/unlock": {"post": {"requestBody": _body({"type": "object"}, False),
                                                 "responses": _answers(_WINDOW_STATE, *admin)}},
            "/metrics": {"get": {"responses": {"200": {"description": "Prometheus text format",
                                                       "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
            **_generation_paths(sorted(decoders or [])),
        },
    }
