"""Helpers for the service tests: tiny bundles built in code and a server on an ephemeral loopback port."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgeattn.bundle.build import BuildConfig, build
from onnx_fixtures import tiny_model


def window_model(hidden: int = 8, seed: int = 1) -> onnx.ModelProto:
    """input_ids [batch, seq], attention_window [] -> embedding + window -> [batch, seq, hidden]."""
    rng = np.random.default_rng(seed)
    emb = numpy_helper.from_array(rng.standard_normal((1000, hidden)).astype(np.float32), "emb")
    nodes = [helper.make_node("Gather", ["emb", "input_ids"], ["x"]),
             helper.make_node("Cast", ["attention_window"], ["w"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "w"], ["hidden"])]
    graph = helper.make_graph(
        nodes, "windowed",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_window", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "seq", hidden])], [emb])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def make_bundle(folder: Path, model: onnx.ModelProto, name: str, batch=(1, 1, 8), seq=(1, 8, 32)):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.onnx"
    onnx.save(model, str(path))
    return build(path, BuildConfig(target="cpu", out=folder / f"{name}.edgeattn", name=name, batch=batch, seq=seq))


def tiny_bundle(folder: Path, name: str = "tiny"):
    return make_bundle(folder, tiny_model(), name)


def wait_ready(client, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.is_server_ready():
            return
        time.sleep(0.02)
    raise TimeoutError("server did not become ready")


def direct(bundle, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The bundle run directly, without the server: the reference."""
    from edgeattn.runtime.backends import open_backend

    backend = open_backend(bundle)
    backend.activate()
    try:
        return backend.infer(feeds)
    finally:
        backend.deactivate()


def dtypes_model() -> onnx.ModelProto:
    """half [batch, 4] FP16, flag [batch, 4] BOOL, count [batch, 4] INT32 -> doubled, negated, incremented."""
    nodes = [helper.make_node("Add", ["half", "half"], ["half_x2"]),
             helper.make_node("Not", ["flag"], ["not_flag"]),
             helper.make_node("Add", ["count", "one"], ["count_plus_1"])]
    graph = helper.make_graph(
        nodes, "dtypes",
        [helper.make_tensor_value_info("half", TensorProto.FLOAT16, ["batch", 4]),
         helper.make_tensor_value_info("flag", TensorProto.BOOL, ["batch", 4]),
         helper.make_tensor_value_info("count", TensorProto.INT32, ["batch", 4])],
        [helper.make_tensor_value_info("half_x2", TensorProto.FLOAT16, ["batch", 4]),
         helper.make_tensor_value_info("not_flag", TensorProto.BOOL, ["batch", 4]),
         helper.make_tensor_value_info("count_plus_1", TensorProto.INT32, ["batch", 4])],
        [numpy_helper.from_array(np.array(1, np.int32), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def wait_ready_http(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if http(url, "GET", "/v2/health/ready")[0] == 200:
            return
        time.sleep(0.02)
    raise TimeoutError("server did not become ready")


def http(url: str, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
         timeout: float = 30) -> tuple[int, dict, dict]:
    """One request on a fresh connection: (status, JSON body or {}, response headers)."""
    import http.client
    import json

    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        raw = response.read()
        try:
            doc = json.loads(raw) if raw else {}
        except ValueError:
            doc = {"raw": raw[:200].decode(errors="replace")}
        return response.status, doc, dict(response.headers)
    finally:
        conn.close()


JSON = {"Content-Type": "application/json"}


def slow_server_main(bundle_path: str, port: int, seconds: float, shutdown_timeout: float) -> None:
    """A server process whose model takes `seconds` per run (batch 1), stopped by signals (shutdown tests).

    Run as `python -c "import serve_support; serve_support.slow_server_main(...)"` with tests/ on the path."""
    from edgeattn.bundle.folder import open_bundle
    from edgeattn.runtime.server.app import MODELS, create_app
    from edgeattn.runtime.server.runner import serve_forever
    from edgeattn.runtime.server.settings import ServeSettings

    settings = ServeSettings(port=port, max_batch=1, warmup_runs=0)  # the timeout is serve_forever's
    app = create_app([open_bundle(bundle_path)], settings, names=["slow"], sensors=False)
    model = app[MODELS]["slow"]
    infer = model.backend.infer

    def slow(feeds):
        time.sleep(seconds)
        return infer(feeds)

    model.backend.infer = slow
    serve_forever(app, "127.0.0.1", port, shutdown_timeout=shutdown_timeout)


def post_json(url: str, path: str, doc, timeout: float = 60) -> tuple[int, dict, dict]:
    import json

    return http(url, "POST", path, json.dumps(doc).encode(), JSON, timeout)


def sse(url: str, path: str, doc, timeout: float = 60) -> tuple[int, list, str]:
    """A streamed request read to its end: (status, the `data:` payloads parsed (the literal "[DONE]" kept
    as a string), the raw body)."""
    import http.client
    import json

    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(doc).encode(), headers=JSON)
        response = conn.getresponse()
        raw = response.read().decode("utf-8")
    finally:
        conn.close()
    events = []
    for block in raw.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return response.status, events, raw


def open_stream(url: str, path: str, doc, timeout: float = 60):
    """Start a streamed request and return (connection, response) to read from line by line."""
    import http.client
    import json

    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    conn.request("POST", path, body=json.dumps(doc).encode(), headers=JSON)
    return conn, conn.getresponse()


def next_event(response):
    """The next `data:` payload of an open stream (None at the end)."""
    import json

    while True:
        line = response.readline()
        if not line:
            return None
        line = line.decode("utf-8").rstrip("\n")
        if line.startswith("data: "):
            data = line[len("data: "):]
            return data if data == "[DONE]" else json.loads(data)


def metric_value(text: str, name: str, labels: str = "") -> float | None:
    """A sample's value from Prometheus text (`name{labels} value`)."""
    for line in text.splitlines():
        if line.startswith(name + ("{" + labels if labels else "")) and not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            if labels or head == name or head.startswith(name + "{"):
                return float(value)
    return None
