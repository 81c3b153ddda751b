"""The HTTP application: KServe v2 REST routes, Triton's config/stats extensions, admin window, /metrics, and
for decoder bundles the OpenAI-compatible and Triton generate routes (generate_routes.py).

`create_app` builds it from bundles, settings, a LiveWindow and an optional thermal controller, so tests
and embedders make their own. A controller is any object with `start()` and `stop()`; if it also has
`metrics_snapshot() -> dict` (see metrics.py for the shape), its readings are exported at each scrape.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import time

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from yarl import URL

from edgeattn import __version__
from edgeattn.bundle.folder import Bundle
from edgeattn.errors import ConfigError, EdgeAttnError, InputError
from edgeattn.runtime.live_window import LiveWindow
from edgeattn.runtime.cuda.devices import resolve_devices
from edgeattn.runtime.server.decoder_group import DecoderGroup
from edgeattn.runtime.server.decoder_runtime import DecoderRuntime, is_decoder, window_bound
from edgeattn.runtime.server.generate_routes import DECODERS, DEVICE, SETTINGS, add_routes
from edgeattn.runtime.server.kserve import HEADER_LENGTH, WINDOW_PARAMETER, ProtocolError, decode_json
from edgeattn.runtime.server.metrics import ServerMetrics, sysfs_sensors
from edgeattn.runtime.server.model_runtime import ModelRuntime
from edgeattn.runtime.server.offload import JsonWorker
from edgeattn.runtime.server.openapi import openapi_document
from edgeattn.runtime.server.request_body import HANDLER_ARGS, read_body
from edgeattn.runtime.server.served_model import VERSION
from edgeattn.runtime.server.settings import ServeSettings

log = logging.getLogger("edgeattn.serve")
EXTENSIONS = ["binary_tensor_data", "model_configuration", "statistics", "edgeattn_attention_window", "generate"]

MODELS = web.AppKey("models", dict)
WINDOW = web.AppKey("window", LiveWindow)
METRICS = web.AppKey("metrics", ServerMetrics)
CONTROLLER = web.AppKey("controller", object)
JSON_WORKER = web.AppKey("json_worker", JsonWorker)


class Startup:
    """The activation and warm-up of every model, once the app runs (`task`)."""

    task: asyncio.Future | None = None


STARTUP = web.AppKey("startup", Startup)
NO_WINDOW_LIMIT = 2**31 - 1  # the window bound when no bundle has a sequence range
ADMIN_BODY_BYTES = 1 << 20  # an admin body is a window, a source and a reason (kept to 200 characters)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def errors_as_json(request: web.Request, handler):
    """Every failure answers {"error": message}: 4xx for the client's mistakes, 5xx for ours."""
    try:
        return await handler(request)
    except ProtocolError as exc:
        response = _error(exc.status, str(exc))
        if exc.status == 408:  # the rest of the body may still trickle in: drop the connection
            response.force_close()
        return response
    except InputError as exc:
        return _error(400, str(exc))
    except EdgeAttnError as exc:
        return _error(500, str(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(exc.status, exc.text or exc.reason)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a bug: answer, log the traceback, keep serving
        log.exception("unexpected error on %s %s", request.method, request.path)
        return _error(500, f"internal error: {type(exc).__name__}: {exc}")


def _model(request: web.Request) -> ModelRuntime:
    name = request.match_info["model"]
    models = request.app[MODELS]
    if name in request.app[DECODERS]:
        raise ProtocolError(f"model {name!r} is a decoder: it answers /v2/models/{name}/generate[_stream] and "
                            f"the OpenAI routes /v1/completions and /v1/chat/completions, not KServe inference")
    if name not in models:
        raise ProtocolError(f"unknown model {name!r}: this server has {_names(request.app)}", 404)
    version = request.match_info.get("version")
    if version not in (None, "", VERSION):
        raise ProtocolError(f"model {name!r} has no version {version!r}: expected {VERSION}", 404)
    return models[name]


async def live(request: web.Request) -> web.Response:
    return web.json_response({"live": True})


async def ready(request: web.Request) -> web.Response:
    ok = all(m.ready for m in _all_models(request.app))
    return web.json_response({"ready": ok}, status=200 if ok else 503)


def _all_models(app: web.Application) -> list:
    return list(app[MODELS].values()) + list(app[DECODERS].values())


def _names(app: web.Application) -> list[str]:
    return sorted([*app[MODELS], *app[DECODERS]])


def _decoder_or_none(request: web.Request) -> DecoderRuntime | None:
    decoder = request.app[DECODERS].get(request.match_info["model"])
    if decoder is not None and request.match_info.get("version") not in (None, "", VERSION):
        raise ProtocolError(f"model {decoder.name!r} has no version {request.match_info['version']!r}: "
                            f"expected {VERSION}", 404)
    return decoder


async def server_metadata(request: web.Request) -> web.Response:
    return web.json_response({"name": "edgeattn", "version": __version__, "extensions": EXTENSIONS})


async def model_metadata(request: web.Request) -> web.Response:
    decoder = _decoder_or_none(request)
    return web.json_response(decoder.metadata() if decoder else _model(request).served.metadata())


async def model_ready(request: web.Request) -> web.Response:
    decoder = _decoder_or_none(request)
    ok = (decoder or _model(request)).ready
    return web.json_response({"ready": ok}, status=200 if ok else 503)


async def model_config(request: web.Request) -> web.Response:
    m, s = _model(request), request.app[SETTINGS]
    return web.json_response(m.served.config(m.max_batch, s.max_queue_delay_ms, s.max_queue))


async def model_stats(request: web.Request) -> web.Response:
    if "model" in request.match_info:
        models = [_decoder_or_none(request) or _model(request)]
    else:
        models = _all_models(request.app)
    return web.json_response({"model_stats": [m.statistics() for m in models]})


async def repository_index(request: web.Request) -> web.Response:
    return web.json_response([{"name": m.name, "version": VERSION, "state": "READY" if m.ready else "UNAVAILABLE"}
                              for m in _all_models(request.app)])


def _device_parameters(app: web.Application) -> dict:
    """The thermal controller's temperature / throttle / power for the response, when one runs."""
    controller = app.get(CONTROLLER)
    if controller is None or not callable(getattr(controller, "metrics_snapshot", None)):
        return {}
    from edgeattn.runtime.thermal.service import response_parameters

    try:
        return response_parameters(controller)
    except Exception:  # a failing sensor must not fail the request
        return {}


async def _read_body(request: web.Request, limit: int | None = None) -> bytes:
    """The whole body, decoded, at most `limit` bytes (default: max_body_bytes), within the body timeout."""
    settings = request.app[SETTINGS]
    return await read_body(request, limit=limit or settings.max_body_bytes, timeout=settings.body_timeout_s)


def _json_bytes(body: bytes, header_length: str | None) -> int:
    """How much of the body is JSON (the binary extension puts raw tensors after the JSON header)."""
    if header_length is None:
        return len(body)
    try:
        return min(int(header_length), len(body))
    except ValueError:
        return 0  # parse_request reports it


async def infer(request: web.Request) -> web.Response:
    started = time.perf_counter()
    model = _model(request)
    metrics, worker = request.app[METRICS], request.app[JSON_WORKER]
    try:
        if not model.ready:
            raise ProtocolError(f"model {model.name!r} is not ready (warming up or shutting down)", 503)
        body = await _read_body(request)
        header_length = request.headers.get(HEADER_LENGTH)
        req = await worker.parse(body, header_length, _json_bytes(body, header_length))
        wanted = None if req.outputs is None else [o.name for o in req.outputs]
        rows = model.served.validate(req.inputs, wanted)
        outcome = await model.infer(req.inputs, rows)
        parameters = {WINDOW_PARAMETER: outcome.window, **_device_parameters(request.app)}
        payload, headers = await worker.encode(model.name, VERSION, req, outcome.outputs, parameters)
    except Exception:
        elapsed = time.perf_counter() - started
        model.stats.fail.add(elapsed)
        metrics.requests.labels(model.name, "error").inc()
        raise
    elapsed = time.perf_counter() - started
    model.stats.success.add(elapsed)
    metrics.requests.labels(model.name, "success").inc()
    metrics.latency.labels(model.name).observe(elapsed)
    return web.Response(body=payload, headers=headers)


async def metrics_page(request: web.Request) -> web.Response:
    metrics, window = request.app[METRICS], request.app[WINDOW]
    metrics.window.set(window.get())
    metrics.window_locked.set(int(window.locked))
    body = generate_latest(metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def _window_state(window: LiveWindow) -> dict:
    history = [{"time": c.time, "old": c.old, "new": c.new, "source": c.source, "reason": c.reason}
               for c in list(window.history)[-20:]]
    return {"window": window.get(), "pages": window.pages, "locked": window.locked, "history": history}


def _names_this_host(host: str) -> bool:
    """Is the Host header an IP address or localhost? (A web page reaching us through DNS rebinding uses
    its own host name, so without a token admin requests must use an address.)"""
    try:
        name = URL(f"http://{host}").host or ""
        if name != "localhost":
            ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _admin_guard(request: web.Request) -> None:
    """Admin routes: same origin only, the token when one is set, JSON bodies only (a web page cannot send
    application/json across origins without a CORS preflight, which this server never grants)."""
    origin = request.headers.get("Origin")
    if origin is not None and origin != f"{request.scheme}://{request.host}":
        raise ProtocolError(f"admin routes refuse cross-origin requests: expected no Origin or "
                            f"{request.scheme}://{request.host}, found {origin[:80]!r}", 403)
    fetch_site = request.headers.get("Sec-Fetch-Site")
    if fetch_site not in (None, "same-origin", "none"):
        raise ProtocolError(f"admin routes refuse cross-site requests: found Sec-Fetch-Site {fetch_site[:40]!r}",
                            403)
    token = request.app[SETTINGS].admin_token
    if token:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise ProtocolError("admin routes need the admin token: expected 'Authorization: Bearer TOKEN'", 401)
    elif not _names_this_host(request.host):
        raise ProtocolError(f"admin routes without an admin token answer only requests to an IP address or "
                            f"localhost, found Host {request.host[:80]!r}", 403)
    if request.method == "POST" and request.content_type != "application/json":
        raise ProtocolError(f"admin routes take JSON: expected Content-Type application/json, found "
                            f"{request.content_type!r}", 415)


async def _json_body(request: web.Request) -> dict:
    _admin_guard(request)
    raw = await _read_body(request, ADMIN_BODY_BYTES)
    if not raw:
        return {}
    doc = decode_json(raw)
    if not isinstance(doc, dict):
        raise ProtocolError(f"expected a JSON object, found {type(doc).__name__}")
    for key in ("source", "reason"):
        if not isinstance(doc.get(key, ""), str):
            raise ProtocolError(f"{key!r}: expected a string, found {type(doc[key]).__name__}")
    return doc


async def window_get(request: web.Request) -> web.Response:
    _admin_guard(request)
    return web.json_response(_window_state(request.app[WINDOW]))


async def window_set(request: web.Request) -> web.Response:
    """POST {"window": N, "reason": "..."}: set it; 409 while it is locked."""
    window, doc = request.app[WINDOW], await _json_body(request)
    if "window" not in doc:
        raise ProtocolError(f'expected {{"window": N}} (0 = full attention, at most {window.max_window})')
    if not window.set(doc["window"], source=doc.get("source", "admin"), reason=doc.get("reason", "")):
        raise ProtocolError(f"the window is locked at {window.get()}: unlock it first", 409)
    return web.json_response(_window_state(window))


async def window_lock(request: web.Request) -> web.Response:
    """POST {"window": N} (optional): pin the window; the controller's changes are ignored until unlock."""
    window, doc = request.app[WINDOW], await _json_body(request)
    window.lock(doc.get("window"), source=doc.get("source", "admin"))
    return web.json_response(_window_state(window))


async def window_unlock(request: web.Request) -> web.Response:
    window = request.app[WINDOW]
    await _json_body(request)
    window.unlock()
    return web.json_response(_window_state(window))


async def openapi(request: web.Request) -> web.Response:
    models = request.app[MODELS].values()
    return web.json_response(openapi_document(__version__, [m.name for m in models],
                                              sorted({s.name for m in models for s in m.served.inputs}),
                                              sorted({s.name for m in models for s in m.served.outputs}),
                                              decoders=sorted(request.app[DECODERS])))


def _routes(app: web.Application) -> None:
    get, post = app.router.add_get, app.router.add_post
    get("/v2/health/live", live)
    get("/v2/health/ready", ready)
    get("/v2", server_metadata)
    post("/v2/repository/index", repository_index)
    get("/v2/models/stats", model_stats)
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        get(base, model_metadata)
        get(base + "/ready", model_ready)
        get(base + "/config", model_config)
        get(base + "/stats", model_stats)
        post(base + "/infer", infer)
    get("/v2/admin/window", window_get)
    post("/v2/admin/window", window_set)
    post("/v2/admin/window/lock", window_lock)
    post("/v2/admin/window/unlock", window_unlock)
    get("/metrics", metrics_page)
    get("/openapi.json", openapi)
    add_routes(app)


def create_app(bundles: list[Bundle], settings: ServeSettings = ServeSettings(), *,
               names: list[str] | None = None, window: LiveWindow | None = None, controller=None,
               metrics: ServerMetrics | None = None, sensors: bool = True, devices: tuple[int, ...] | None = None,
               device_windows: list[LiveWindow] | None = None) -> web.Application:
    """The service for `bundles` (named by their manifests unless `names` is given).

    Models are activated and warmed up in the background once the app starts (`app[STARTUP]` is that
    task; runner.serve_forever ends the process when it fails): health/live answers at once,
    health/ready and each model's ready only after warm-up. On shutdown (`drain`), queued requests
    finish within the shutdown timeout (503 for the rest) before the backends are released and the
    controller is stopped. The window is bounded by the longest sequence the bundles accept (a decoder's
    ring). Decoder bundles (manifest section `decoder`) are served by the generation routes, with
    continuous batching over `settings.slots` slots; the others by KServe v2 inference.

    `settings.devices` (cuda bundles): one engine per GPU behind each name (decoder_group.py), on `devices` (the
    GPU indices, resolved from the settings when not given); `device_windows`, one per GPU, are the windows their
    thermal controllers move (default: every engine follows `window`; the admin routes' changes reach them all).
    """
    names = names or [b.manifest.name for b in bundles]
    if len(names) != len(bundles):
        raise ConfigError(f"expected one name per bundle ({len(bundles)}), found {len(names)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"model names must be unique, found {names}: give each bundle its own name")
    window = window or LiveWindow(settings.window)
    if window.max_window is None:
        window.bound(max((window_bound(b) for b in bundles), default=0) or NO_WINDOW_LIMIT)
    metrics = metrics or ServerMetrics()
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[errors_as_json],
                          handler_args={**HANDLER_ARGS, "keepalive_timeout": settings.header_timeout_s})
    app[SETTINGS], app[WINDOW], app[METRICS], app[CONTROLLER] = settings, window, metrics, controller
    app[JSON_WORKER], app[STARTUP] = JsonWorker(), Startup()
    app[MODELS] = {n: ModelRuntime(b, n, settings, window, metrics)
                   for n, b in zip(names, bundles) if not is_decoder(b)}
    if settings.devices and devices is None:
        devices = resolve_devices(bundles, settings.devices)
    if devices is None:
        app[DECODERS] = {n: DecoderRuntime(b, n, settings, window, metrics)
                         for n, b in zip(names, bundles) if is_decoder(b)}
    else:
        windows = device_windows or [window] * len(devices)
        if len(windows) != len(devices):
            raise ConfigError(f"expected one window per GPU ({len(devices)}), found {len(windows)}")
        app[DECODERS] = {n: DecoderGroup([DecoderRuntime(b, n, settings, w, metrics, device=d)
                                          for d, w in zip(devices, windows)])
                         for n, b in zip(names, bundles) if is_decoder(b)}
        for w in {id(w): w for w in windows if w is not window}.values():
            window.subscribe(lambda change, w=w: w.set(change.new, source=change.source, reason=change.reason,
                                                            pages=change.pages))
    app[DEVICE] = lambda: _device_parameters(app)
    _routes(app)
    metrics.window.set(window.get())
    window.subscribe(lambda change: metrics.window.set(change.new))
    if sensors:
        metrics.add_source(sysfs_sensors())
    if controller is not None and callable(getattr(controller, "metrics_snapshot", None)):
        metrics.add_source(controller.metrics_snapshot)
    app.cleanup_ctx.append(_lifespan(controller))
    return app


async def drain(app: web.Application, timeout: float | None = None) -> None:
    """Stop taking requests (503), finish the queued ones within `timeout` s (default: the settings'
    shutdown timeout; 503 for the rest), release the models."""
    timeout = app[SETTINGS].shutdown_timeout_s if timeout is None else timeout
    await asyncio.gather(*(m.stop(timeout) for m in _all_models(app)), return_exceptions=True)


def abandon(app: web.Application) -> None:
    """Answer every queued request 503 now (a second stop signal); running batches still finish."""
    for m in _all_models(app):
        m.abandon()


def _lifespan(controller):
    async def lifespan(app: web.Application):
        models = _all_models(app)
        warmup = asyncio.ensure_future(asyncio.gather(*(m.start() for m in models)))
        warmup.add_done_callback(_log_failure)
        app[STARTUP].task = warmup
        if controller is not None:
            controller.start()
        yield
        if not warmup.done():
            warmup.cancel()
        if controller is not None:
            controller.stop()
        await drain(app)
        app[JSON_WORKER].close()

    return lifespan


def _log_failure(task: asyncio.Future) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("model start-up failed: %s", task.exception())
