"""The HTTP application: KServe v2 REST routes, Triton's config/stats extensions, admin window, /metrics.

`create_app` builds it from bundles, settings, a LiveWindow and an optional thermal controller, so tests
and embedders make their own. A controller is any object with `start()` and `stop()`; if it also has
`metrics_snapshot() -> dict` (see metrics.py for the shape), its readings are exported at each scrape.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from edgeattn import __version__
from edgeattn.bundle.folder import Bundle
from edgeattn.errors import ConfigError, EdgeAttnError, InputError
from edgeattn.runtime.live_window import LiveWindow
from edgeattn.runtime.server.kserve import HEADER_LENGTH, WINDOW_PARAMETER, ProtocolError, encode_response, \
    parse_request
from edgeattn.runtime.server.metrics import ServerMetrics, sysfs_sensors
from edgeattn.runtime.server.model_runtime import ModelRuntime
from edgeattn.runtime.server.served_model import VERSION
from edgeattn.runtime.server.settings import ServeSettings

log = logging.getLogger("edgeattn.serve")
EXTENSIONS = ["binary_tensor_data", "model_configuration", "statistics", "edgeattn_attention_window"]

MODELS = web.AppKey("models", dict)
SETTINGS = web.AppKey("settings", ServeSettings)
WINDOW = web.AppKey("window", LiveWindow)
METRICS = web.AppKey("metrics", ServerMetrics)
CONTROLLER = web.AppKey("controller", object)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def errors_as_json(request: web.Request, handler):
    """Every failure answers {"error": message}: 4xx for the client's mistakes, 5xx for ours."""
    try:
        return await handler(request)
    except ProtocolError as exc:
        return _error(exc.status, str(exc))
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
    if name not in models:
        raise ProtocolError(f"unknown model {name!r}: this server has {sorted(models)}", 404)
    version = request.match_info.get("version")
    if version not in (None, "", VERSION):
        raise ProtocolError(f"model {name!r} has no version {version!r}: expected {VERSION}", 404)
    return models[name]


async def live(request: web.Request) -> web.Response:
    return web.json_response({"live": True})


async def ready(request: web.Request) -> web.Response:
    ok = all(m.ready for m in request.app[MODELS].values())
    return web.json_response({"ready": ok}, status=200 if ok else 503)


async def server_metadata(request: web.Request) -> web.Response:
    return web.json_response({"name": "edgeattn", "version": __version__, "extensions": EXTENSIONS})


async def model_metadata(request: web.Request) -> web.Response:
    return web.json_response(_model(request).served.metadata())


async def model_ready(request: web.Request) -> web.Response:
    ok = _model(request).ready
    return web.json_response({"ready": ok}, status=200 if ok else 503)


async def model_config(request: web.Request) -> web.Response:
    m, s = _model(request), request.app[SETTINGS]
    return web.json_response(m.served.config(m.max_batch, s.max_queue_delay_ms, s.max_queue))


async def model_stats(request: web.Request) -> web.Response:
    models = [_model(request)] if "model" in request.match_info else request.app[MODELS].values()
    return web.json_response({"model_stats": [m.statistics() for m in models]})


async def repository_index(request: web.Request) -> web.Response:
    return web.json_response([{"name": n, "version": VERSION, "state": "READY" if m.ready else "UNAVAILABLE"}
                              for n, m in request.app[MODELS].items()])


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


async def infer(request: web.Request) -> web.Response:
    started = time.perf_counter()
    model = _model(request)
    metrics = request.app[METRICS]
    try:
        if not model.ready:
            raise ProtocolError(f"model {model.name!r} is not ready (warming up or shutting down)", 503)
        body = await request.read()
        req = parse_request(body, request.headers.get(HEADER_LENGTH))
        wanted = None if req.outputs is None else [o.name for o in req.outputs]
        rows = model.served.validate(req.inputs, wanted)
        outcome = await model.infer(req.inputs, rows)
        parameters = {WINDOW_PARAMETER: outcome.window, **_device_parameters(request.app)}
        payload, headers = encode_response(model.name, VERSION, req, outcome.outputs, parameters)
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
               for c in window.history[-20:]]
    return {"window": window.get(), "locked": window.locked, "history": history}


async def _json_body(request: web.Request) -> dict:
    raw = await request.read()
    if not raw:
        return {}
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ProtocolError(f"expected a JSON object, found {type(doc).__name__}")
    return doc


async def window_get(request: web.Request) -> web.Response:
    return web.json_response(_window_state(request.app[WINDOW]))


async def window_set(request: web.Request) -> web.Response:
    """POST {"window": N, "reason": "..."}: set it; 409 while it is locked."""
    window, doc = request.app[WINDOW], await _json_body(request)
    if "window" not in doc:
        raise ProtocolError('expected {"window": N} (0 = full attention)')
    if not window.set(doc["window"], source=str(doc.get("source", "admin")), reason=str(doc.get("reason", ""))):
        raise ProtocolError(f"the window is locked at {window.get()}: unlock it first", 409)
    return web.json_response(_window_state(window))


async def window_lock(request: web.Request) -> web.Response:
    """POST {"window": N} (optional): pin the window; the controller's changes are ignored until unlock."""
    window, doc = request.app[WINDOW], await _json_body(request)
    window.lock(doc.get("window"), source=str(doc.get("source", "admin")))
    return web.json_response(_window_state(window))


async def window_unlock(request: web.Request) -> web.Response:
    window = request.app[WINDOW]
    window.unlock()
    return web.json_response(_window_state(window))


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


def create_app(bundles: list[Bundle], settings: ServeSettings = ServeSettings(), *,
               names: list[str] | None = None, window: LiveWindow | None = None, controller=None,
               metrics: ServerMetrics | None = None, sensors: bool = True) -> web.Application:
    """The service for `bundles` (named by their manifests unless `names` is given).

    Models are activated and warmed up in the background once the app starts: health/live answers at
    once, health/ready and each model's ready only after warm-up. On shutdown, queued requests finish
    before the backends are released and the controller is stopped.
    """
    names = names or [b.manifest.name for b in bundles]
    if len(names) != len(bundles):
        raise ConfigError(f"expected one name per bundle ({len(bundles)}), found {len(names)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"model names must be unique, found {names}: give each bundle its own name")
    window = window or LiveWindow(settings.window)
    metrics = metrics or ServerMetrics()
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[errors_as_json])
    app[SETTINGS], app[WINDOW], app[METRICS], app[CONTROLLER] = settings, window, metrics, controller
    app[MODELS] = {n: ModelRuntime(b, n, settings, window, metrics) for n, b in zip(names, bundles)}
    _routes(app)
    metrics.window.set(window.get())
    window.subscribe(lambda change: metrics.window.set(change.new))
    if sensors:
        metrics.add_source(sysfs_sensors())
    if controller is not None and callable(getattr(controller, "metrics_snapshot", None)):
        metrics.add_source(controller.metrics_snapshot)
    app.cleanup_ctx.append(_lifespan(controller))
    return app


def _lifespan(controller):
    async def lifespan(app: web.Application):
        models = list(app[MODELS].values())
        warmup = asyncio.ensure_future(asyncio.gather(*(m.start() for m in models)))
        warmup.add_done_callback(_log_failure)
        if controller is not None:
            controller.start()
        yield
        if not warmup.done():
            warmup.cancel()
        if controller is not None:
            controller.stop()
        await asyncio.gather(*(m.stop() for m in models), return_exceptions=True)

    return lifespan


def _log_failure(task: asyncio.Future) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("model start-up failed: %s", task.exception())
