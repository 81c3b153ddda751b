"""HTTP routes of decoder bundles: OpenAI's /v1/models, /v1/completions and /v1/chat/completions (server-sent
events when `stream` is true) and Triton's /v2/models/{model}/generate and /generate_stream.

The handlers only route. A request's body is bounded (`max_generate_body_bytes`) and read within the body
timeout; decoding its JSON, validating it and tokenizing the prompt run in a small thread pool (`PREPARE`),
never on the event loop, so a long prompt delays nobody's health check or stream; the model runs in the
scheduler's worker. A client that goes away (a failed write, or a closed transport while waiting) cancels its
job, which frees the slot before the next decode step.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from edgeattn.errors import EdgeAttnError, InputError
from edgeattn.runtime.server.decoder_runtime import DecoderRuntime, Stream
from edgeattn.runtime.server.kserve import WINDOW_PARAMETER, ProtocolError, decode_json
from edgeattn.runtime.server.openai_protocol import (BUDGET_PARAMETER, OpenAIError, TextRequest, check_budget,
                                                     chunk_body, completion_body, now, parse_text_request,
                                                     parse_triton_generate, request_id, usage, usage_chunk)
from edgeattn.runtime.server.request_body import read_body
from edgeattn.runtime.server.scheduler import QueueFull
from edgeattn.runtime.server.served_model import VERSION
from edgeattn.runtime.server.settings import ServeSettings

SETTINGS = web.AppKey("settings", ServeSettings)
DECODERS = web.AppKey("decoders", dict)
DEVICE = web.AppKey("device_parameters", object)  # () -> dict: the controller's temperature etc.
PREPARE = web.AppKey("prepare", ThreadPoolExecutor)  # JSON decoding, validation and tokenizing of requests
PREPARE_THREADS = 2
RETRY_AFTER_S = 1
DISCONNECT_POLL_S = 0.5
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ClientGone(Exception):
    pass


def openai_errors(handler):
    """OpenAI's error shape for every failure of a /v1 route."""
    async def wrapped(request: web.Request):
        try:
            return await handler(request)
        except OpenAIError as exc:
            return _openai_error(exc)
        except ProtocolError as exc:
            response = _openai_error(OpenAIError(str(exc), exc.status))
            if exc.status == 408:  # the rest of the body may still trickle in: drop the connection
                response.force_close()
            return response
        except EdgeAttnError as exc:
            return _openai_error(OpenAIError(str(exc), 400 if isinstance(exc, InputError) else 500))
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _openai_error(OpenAIError(exc.text or exc.reason, exc.status))
    return wrapped


def _openai_error(exc: OpenAIError) -> web.Response:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if exc.status == 429 else None
    return web.json_response(exc.body(), status=exc.status, headers=headers)


def _decoder(app: web.Application, name: str) -> DecoderRuntime:
    decoders = app[DECODERS]
    if name not in decoders:
        raise OpenAIError(f"unknown model {name!r}: this server generates with {sorted(decoders)}", 404,
                          param="model", code="model_not_found")
    model = decoders[name]
    if not model.ready:
        raise OpenAIError(f"model {name!r} is not ready (warming up or shutting down)", 503,
                          type="service_unavailable")
    return model


async def _prepared(request: web.Request, prepare):
    """`prepare(raw body)` run in the PREPARE pool, on the body read within the generation routes' bounds."""
    settings = request.app[SETTINGS]
    raw = await read_body(request, limit=settings.max_generate_body_bytes, timeout=settings.body_timeout_s)
    return await asyncio.get_running_loop().run_in_executor(request.app[PREPARE], prepare, raw)


def _stop_limits(app: web.Application) -> dict:
    settings = app[SETTINGS]
    return {"max_stops": settings.max_stops, "max_stop_chars": settings.max_stop_chars}


def _encode(codec, text: str) -> list[int]:
    """The text's token ids, through the tokenizer's batch call when it has one: `encode_batch` lets go of
    the GIL while it runs, `encode` holds it (a 1 MB prompt stopped every other thread, the event loop's
    included, for 4.8 s on the dev machine)."""
    tokenizer = getattr(codec, "tokenizer", None)
    if callable(getattr(tokenizer, "encode_batch", None)):
        return tokenizer.encode_batch([text], add_special_tokens=False)[0].ids
    return codec.encode(text)


def _parameters(app: web.Application, window: int, budget: int | None = None) -> dict:
    """A response's parameters: the window and the attention budget (rows) it ran with, and the device's."""
    budget = {} if budget is None else {BUDGET_PARAMETER: budget}
    return {WINDOW_PARAMETER: window, **budget, **app[DEVICE]()}


def _prompt_ids(model: DecoderRuntime, req: TextRequest) -> list[int]:
    codec = model.codec
    if req.chat:
        text = codec.render_chat(req.prompt)
    elif isinstance(req.prompt, str):
        text = req.prompt
    else:
        limit = model.model.vocab_size
        bad = [t for t in req.prompt if not 0 <= t < limit]
        if bad:
            raise OpenAIError(f"prompt: token ids must be in 0..{limit - 1}, found {str(bad[0])[:60]}",
                              param="prompt")
        return list(req.prompt)
    ids = _encode(codec, text)
    if not ids:
        raise OpenAIError("prompt: expected at least one token, found an empty prompt", param="prompt")
    return ids


def _submit(model: DecoderRuntime, req: TextRequest, ids: list[int]) -> Stream:
    try:
        return model.submit(ids, max_tokens=req.max_tokens, sampling=req.sampling, stops=req.stop,
                            budget=req.attention_budget)
    except QueueFull as exc:
        raise OpenAIError(f"the server is busy ({exc}): retry after {RETRY_AFTER_S} s", 429,
                          type="rate_limit_error", code="queue_full") from None


async def _next(stream: Stream, request: web.Request):
    while True:
        try:
            return await asyncio.wait_for(stream.events.get(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            transport = request.transport
            if transport is None or transport.is_closing():
                raise ClientGone from None


def _check_error(finish: str) -> None:
    if finish.startswith("error"):
        raise OpenAIError(f"generation failed: {finish[len('error: '):]}", 500, type="server_error")


async def _collect(stream: Stream, request: web.Request) -> tuple[str, str, int, int]:
    """Wait for the whole answer: (text, finish reason, last window, last budget in rows)."""
    parts = []
    try:
        while True:
            event = await _next(stream, request)
            parts.append(event.text)
            if event.finish_reason is not None:
                _check_error(event.finish_reason)
                return "".join(parts), event.finish_reason, event.window, event.budget
    finally:
        if stream.job.finish_reason is None:
            stream.cancel()


async def _sse(response: web.StreamResponse, doc) -> None:
    data = doc if isinstance(doc, str) else json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
    await response.write(f"data: {data}\n\n".encode())


async def _serve_sse(stream: Stream, events) -> web.StreamResponse:
    """Server-sent events written by `events(response)`; a client that goes away (or any early end) cancels the
    stream, which frees its slot."""
    response = web.StreamResponse(headers=SSE_HEADERS)
    try:
        await events(response)
        await response.write_eof()
    except (ClientGone, ConnectionError):
        pass
    finally:
        if stream.job.finish_reason is None:
            stream.cancel()
    return response


async def _stream_openai(request: web.Request, model: DecoderRuntime, req: TextRequest, stream: Stream):
    rid, created, app = request_id(req.chat), now(), request.app

    async def events(response: web.StreamResponse) -> None:
        await response.prepare(request)
        if req.chat:
            await _sse(response, chunk_body(req, rid, created, None, None, _parameters(app, 0), role=True))
        while True:
            event = await _next(stream, request)
            finish = event.finish_reason
            if finish is not None and finish.startswith("error"):
                await _sse(response, OpenAIError(f"generation failed: {finish[7:]}", 500, type="server_error").body())
                break
            if event.text or finish is not None:
                await _sse(response, chunk_body(req, rid, created, event.text or None, finish,
                                                _parameters(app, event.window, event.budget)))
            if finish is not None:
                if req.include_usage:
                    job = stream.job
                    await _sse(response, usage_chunk(req, rid, created,
                                                     usage(job.prompt_tokens, len(job.tokens), job.evicted)))
                await _sse(response, "[DONE]")
                break

    return await _serve_sse(stream, events)


def _openai_request(app: web.Application, chat: bool, raw: bytes) -> tuple[DecoderRuntime, TextRequest, list]:
    """In the PREPARE pool: the body decoded and validated, the prompt tokenized."""
    doc = decode_json(raw)
    name = doc.get("model") if isinstance(doc, dict) else None
    if not isinstance(name, str):
        raise OpenAIError(f"model: expected a string, found {str(name)[:60]!r}", param="model")
    model = _decoder(app, name)
    req = parse_text_request(doc, chat=chat, max_tokens_limit=model.max_tokens_limit, **_stop_limits(app))
    check_budget(req, model.layout)
    return model, req, _prompt_ids(model, req)


async def _answer_openai(request: web.Request, chat: bool) -> web.StreamResponse:
    app = request.app
    model, req, ids = await _prepared(request, lambda raw: _openai_request(app, chat, raw))
    stream = _submit(model, req, ids)
    if req.stream:
        return await _stream_openai(request, model, req, stream)
    try:
        text, finish, window, budget = await _collect(stream, request)
    except ClientGone:
        return web.Response(status=499)
    job = stream.job
    return web.json_response(completion_body(req, request_id(chat), now(), text, finish,
                                             usage(job.prompt_tokens, len(job.tokens), job.evicted),
                                             _parameters(request.app, window, budget)))


@openai_errors
async def completions(request: web.Request) -> web.StreamResponse:
    return await _answer_openai(request, chat=False)


@openai_errors
async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _answer_openai(request, chat=True)


@openai_errors
async def list_models(request: web.Request) -> web.Response:
    data = [{"id": n, "object": "model", "created": m.created, "owned_by": "edgeattn"}
            for n, m in request.app[DECODERS].items()]
    return web.json_response({"object": "list", "data": data})


# --- Triton's generate extension (errors as {"error": message}, from the app's middleware) -----------------
def _triton_model(request: web.Request) -> DecoderRuntime:
    name = request.match_info["model"]
    decoders = request.app[DECODERS]
    if name not in decoders:
        raise ProtocolError(f"unknown model {name!r}: generate serves {sorted(decoders)}", 404)
    version = request.match_info.get("version")
    if version not in (None, "", VERSION):
        raise ProtocolError(f"model {name!r} has no version {version[:40]!r}: expected {VERSION}", 404)
    model = decoders[name]
    if not model.ready:
        raise ProtocolError(f"model {name!r} is not ready (warming up or shutting down)", 503)
    return model


async def _triton_request(request: web.Request, stream: bool) -> tuple[DecoderRuntime, Stream, TextRequest]:
    model, limits = _triton_model(request), _stop_limits(request.app)

    def prepare(raw: bytes) -> tuple[TextRequest, list[int]]:
        req = parse_triton_generate(decode_json(raw), model.name, max_tokens_limit=model.max_tokens_limit,
                                    stream=stream, **limits)
        check_budget(req, model.layout)
        return req, _prompt_ids(model, req)

    try:
        req, ids = await _prepared(request, prepare)
        return model, _submit(model, req, ids), req
    except OpenAIError as exc:
        raise ProtocolError(str(exc), exc.status) from None


def _triton_body(model: DecoderRuntime, text: str, finish: str | None, window: int, app, job=None,
                 budget: int | None = None) -> dict:
    body = {"model_name": model.name, "model_version": "1", "text_output": text,
            "parameters": _parameters(app, window, budget)}
    if finish is not None:
        body["finish_reason"] = finish
        body["usage"] = usage(job.prompt_tokens, len(job.tokens), job.evicted)
    return body


async def generate(request: web.Request) -> web.Response:
    model, stream, _ = await _triton_request(request, stream=False)
    try:
        text, finish, window, budget = await _collect(stream, request)
    except ClientGone:
        return web.Response(status=499)
    except OpenAIError as exc:
        raise ProtocolError(str(exc), exc.status) from None
    return web.json_response(_triton_body(model, text, finish, window, request.app, stream.job, budget))


async def generate_stream(request: web.Request) -> web.StreamResponse:
    model, stream, _ = await _triton_request(request, stream=True)

    async def events(response: web.StreamResponse) -> None:
        await response.prepare(request)
        while True:
            event = await _next(stream, request)
            finish = event.finish_reason
            if finish is not None and finish.startswith("error"):
                await _sse(response, {"error": f"generation failed: {finish[7:]}"})
                break
            if event.text or finish is not None:
                await _sse(response, _triton_body(model, event.text, finish, event.window, request.app,
                                                  stream.job, event.budget))
            if finish is not None:
                break

    return await _serve_sse(stream, events)


async def _close_pool(app: web.Application) -> None:
    app[PREPARE].shutdown(wait=False, cancel_futures=True)


def add_routes(app: web.Application) -> None:
    """The generation routes, and their PREPARE pool (shut down with the app)."""
    app[PREPARE] = ThreadPoolExecutor(PREPARE_THREADS, thread_name_prefix="edgeattn-prepare")
    app.on_cleanup.append(_close_pool)
    get, post = app.router.add_get, app.router.add_post
    get("/v1/models", list_models)
    post("/v1/completions", completions)
    post("/v1/chat/completions", chat_completions)
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        post(base + "/generate", generate)
        post(base + "/generate_stream", generate_stream)
