"""Client mistakes are 4xx with a clear message, never a 500; large JSON does not stall the event loop; a
slow body is cut off; a flood of failing requests costs at most one extra run each. Real server, loopback."""

from __future__ import annotations

import http.client as http_client
import json
import socket
import threading

import numpy as np
import pytest

pytest.importorskip("aiohttp")

from edgeattn.runtime.server.app import MODELS, create_app  # noqa: E402
from edgeattn.runtime.server.runner import BackgroundServer  # noqa: E402
from edgeattn.runtime.server.settings import ServeSettings  # noqa: E402
from serve_support import JSON, direct, http, tiny_bundle, wait_ready_http  # noqa: E402

INFER = "/v2/models/tiny/infer"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return tiny_bundle(tmp_path_factory.mktemp("bad"))


@pytest.fixture(scope="module")
def server(bundle):
    app = create_app([bundle], ServeSettings(port=0, warmup_runs=0, body_timeout_s=1.0), sensors=False)
    with BackgroundServer(app) as url:
        wait_ready_http(url)
        yield url


def _request(ids, mask=None, *, dtype="INT64", shape=None, raw_ids=None) -> bytes:
    shape = shape or list(np.shape(ids))
    data = raw_ids if raw_ids is not None else np.asarray(ids).ravel().tolist()
    mask = np.ones(shape, np.int64).ravel().tolist() if mask is None else mask
    return json.dumps({"inputs": [
        {"name": "input_ids", "datatype": dtype, "shape": shape, "data": data},
        {"name": "attention_mask", "datatype": "INT64", "shape": shape, "data": mask}]}).encode()


def _raw(ids_data: str, shape: str = "[1, 2]", mask: str = "[1, 1]") -> bytes:
    return (f'{{"inputs": [{{"name": "input_ids", "datatype": "INT64", "shape": {shape}, "data": {ids_data}}},'
            f'{{"name": "attention_mask", "datatype": "INT64", "shape": {shape}, "data": {mask}}}]}}').encode()


CASES = {
    "dims overflow int64": (_raw("[1, 2]", shape="[4294967296, 4294967296]"), "shape"),
    "dim above int64": (_raw("[1, 2]", shape="[1, 9223372036854775808]"), "shape"),
    "integer above int64": (_raw("[9223372036854775808, 1]"), "INT64"),
    "integer far above int64": (_raw("[1" + "0" * 40 + ", 1]"), "INT64"),
    "integer below int64": (_raw("[-9223372036854775809, 1]"), "INT64"),
    "infinity": (_raw("[Infinity, 1]"), "INT64"),
    "NaN": (_raw("[NaN, 1]"), "INT64"),
    "float in INT64": (_raw("[1.7, 2]"), "INT64"),
    "string in INT64": (_raw('["1", "2"]'), "INT64"),
    "bool in INT64": (_raw("[true, false]"), "INT64"),
    "nested data": (_raw("[[1], [2]]"), "flat"),
    "deeply nested JSON": (b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested"),
    "deeply nested data": (_raw("[" * 5000 + "1" + "]" * 5000), "nested"),
    "token id = vocabulary": (_raw("[1000, 1]"), "0..999"),
    "token id -1": (_raw("[-1, 1]"), "0..999"),
    "binary size above int64": (json.dumps({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 2],
                                                        "parameters": {"binary_data_size": 2**70}}]}).encode(),
                                "binary_data_size"),
}


@pytest.mark.parametrize("what", sorted(CASES))
def test_client_mistake_is_a_400_with_a_clear_message(server, what):
    body, phrase = CASES[what]
    status, doc, _ = http(server, "POST", INFER, body, JSON)
    assert status == 400, (what, status, doc)
    assert phrase in doc["error"], (what, doc)
    assert "onnxruntime" not in doc["error"].lower() and "internal error" not in doc["error"]


def test_valid_ids_at_the_edges_of_the_vocabulary(server, bundle):
    ids = np.array([[0, 999]], np.int64)
    status, doc, _ = http(server, "POST", INFER, _request(ids), JSON)
    assert status == 200, doc
    expected = direct(bundle, {"input_ids": ids, "attention_mask": np.ones_like(ids)})["last_hidden_state"]
    np.testing.assert_array_equal(np.array(doc["outputs"][0]["data"], np.float32).reshape(1, 2, 16), expected)


def test_a_slow_body_is_cut_off(server):
    host, port = server.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:  # a hang guard (the body timeout: 1 s)
        s.sendall(b"POST " + INFER.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{")
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:100]


def _answers_while(fn, url: str) -> tuple[int, object]:
    """Run fn() while polling /v2/health/live; how many health answers arrived while fn() was running. An event
    loop blocked by fn's request answers at most one or two (before and after it); a free one answers many."""
    answers, running, done = [0], threading.Event(), threading.Event()

    def poll() -> None:
        while not done.is_set():
            http(url, "GET", "/v2/health/live", timeout=120)
            if running.is_set():
                answers[0] += 1

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        running.set()
        result = fn()
        running.clear()
    finally:
        done.set()
        poller.join()
    return answers[0], result


def test_large_json_does_not_stall_other_endpoints(server):
    n = 2_000_000  # about 14 MB of JSON: several seconds of parsing
    body = _raw("[" + ", ".join(["7"] * n) + "]", shape=f"[1, {n}]", mask="[" + ", ".join(["1"] * n) + "]")
    answered, (status, doc, _) = _answers_while(lambda: http(server, "POST", INFER, body, JSON, timeout=120), server)
    assert status == 400 and "expected 1..32" in doc["error"], doc
    assert answered >= 5, f"only {answered} health answers while a large JSON body was parsed"


def test_large_json_response_does_not_stall_other_endpoints(tmp_path):
    from serve_support import make_bundle
    from onnx_fixtures import tiny_model

    big = make_bundle(tmp_path, tiny_model(hidden=512), "wide", batch=(1, 8, 8), seq=(1, 512, 512))
    app = create_app([big], ServeSettings(port=0, warmup_runs=0), sensors=False)
    ids = np.ones((8, 512), np.int64)
    body = _request(ids)

    def raw_infer() -> tuple[int, bytes]:  # parsed after timing: this process also runs the server
        host, port = url.split(":")
        conn = http_client.HTTPConnection(host, int(port), timeout=120)
        conn.request("POST", "/v2/models/wide/infer", body=body, headers=JSON)
        response = conn.getresponse()
        return response.status, response.read()

    with BackgroundServer(app) as url:
        wait_ready_http(url)
        answered, (status, raw) = _answers_while(raw_infer, url)
    assert status == 200 and len(json.loads(raw)["outputs"][0]["data"]) == 8 * 512 * 512
    assert answered >= 5, f"only {answered} health answers while a large JSON response was encoded"


def test_a_flood_of_failing_requests_costs_at_most_one_extra_run_each(bundle):
    settings = ServeSettings(port=0, warmup_runs=0, max_batch=8, max_queue_delay_ms=50)
    app = create_app([bundle], settings, names=["flaky"], sensors=False)
    model = app[MODELS]["flaky"]
    infer, runs = model.backend.infer, []

    def failing_on_7(feeds):
        runs.append(feeds["input_ids"].shape[0])
        if (feeds["input_ids"] == 7).any():
            raise RuntimeError("this input breaks the backend")
        return infer(feeds)

    model.backend.infer = failing_on_7
    results = []
    with BackgroundServer(app) as url:
        wait_ready_http(url)

        def client(i: int) -> None:
            ids = np.full((1, 4), 7 if i % 2 else 3, np.int64)
            results.append((i, http(url, "POST", "/v2/models/flaky/infer", _request(ids), JSON)[0]))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(48)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert sorted(s for i, s in results if i % 2 == 0) == [200] * 24  # good requests are answered
    assert sorted(s for i, s in results if i % 2) == [500] * 24
    # after the first stacked failure, requests run alone for a while: no more stacked runs to repeat
    stacked = [rows for rows in runs if rows > 1]
    assert len(stacked) <= 2 and len(runs) <= 48 + len(stacked), runs


def test_a_killed_json_worker_costs_one_request_and_is_replaced(bundle):
    import os
    import signal as signals

    from edgeattn.runtime.server.app import JSON_WORKER

    app = create_app([bundle], ServeSettings(port=0, warmup_runs=0), sensors=False)
    n = 100_000  # above the offload size: decoded in the worker
    body = _raw("[" + ", ".join(["7"] * n) + "]", shape=f"[1, {n}]", mask="[" + ", ".join(["1"] * n) + "]")
    with BackgroundServer(app) as url:
        wait_ready_http(url)
        assert http(url, "POST", INFER, body, JSON)[0] == 400  # too long for the bundle, but decoded
        assert app[JSON_WORKER].pids
        for pid in app[JSON_WORKER].pids:
            os.kill(pid, signals.SIGKILL)
        statuses = [http(url, "POST", INFER, body, JSON)[0] for _ in range(2)]
    assert statuses in ([503, 400], [400, 400]), statuses
