"""The service end to end: a real server on 127.0.0.1 (ephemeral port) and an unmodified tritonclient.http."""

from __future__ import annotations

import http.client
import json
import threading

import numpy as np
import pytest

tritonclient_http = pytest.importorskip("tritonclient.http")
pytest.importorskip("aiohttp")

from edgeattn.runtime.live_window import LiveWindow  # noqa: E402
from edgeattn.runtime.server.app import create_app  # noqa: E402
from edgeattn.runtime.server.runner import BackgroundServer  # noqa: E402
from edgeattn.runtime.server.settings import ServeSettings  # noqa: E402
from serve_support import direct, dtypes_model, make_bundle, tiny_bundle, wait_ready, window_model  # noqa: E402


class FakeController:
    """The thermal controller's hook: start/stop and a metrics snapshot."""

    def __init__(self) -> None:
        self.started = self.stopped = 0

    def start(self) -> None:
        self.started += 1

    def stop(self) -> None:
        self.stopped += 1

    def metrics_snapshot(self) -> dict:
        return {"temperature_celsius": {"gpu-thermal": 61.5}, "power_watts": {"VDD_IN": 7.25}, "throttled": 1}


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve")
    return {"tiny": tiny_bundle(folder), "windowed": make_bundle(folder, window_model(), "windowed"),
            "dtypes": make_bundle(folder, dtypes_model(), "dtypes")}


@pytest.fixture(scope="module")
def server(bundles):
    window = LiveWindow(0)
    controller = FakeController()
    settings = ServeSettings(port=0, max_batch=8, max_queue_delay_ms=5, max_body_bytes=1 << 20)
    app = create_app(list(bundles.values()), settings, window=window, controller=controller,
                     sensors=False)
    with BackgroundServer(app) as url:
        client = tritonclient_http.InferenceServerClient(url)
        wait_ready(client)
        yield {"url": url, "client": client, "window": window, "controller": controller}
    assert controller.stopped == 1


def _inputs(ids: np.ndarray, mask: np.ndarray, binary: bool):
    inputs = [tritonclient_http.InferInput("input_ids", list(ids.shape), "INT64"),
              tritonclient_http.InferInput("attention_mask", list(mask.shape), "INT64")]
    inputs[0].set_data_from_numpy(ids, binary_data=binary)
    inputs[1].set_data_from_numpy(mask, binary_data=binary)
    return inputs


def _post(url: str, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


def test_health_metadata_and_config(server):
    client = server["client"]
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("tiny") and client.is_model_ready("windowed")
    assert not client.is_model_ready("absent")
    meta = client.get_model_metadata("tiny")
    assert [i["name"] for i in meta["inputs"]] == ["input_ids", "attention_mask"]
    assert meta["outputs"] == [{"name": "last_hidden_state", "datatype": "FP32", "shape": [-1, -1, 16]}]
    # the window input is the server's: clients are not asked for it
    assert [i["name"] for i in client.get_model_metadata("windowed")["inputs"]] == ["input_ids"]
    config = client.get_model_config("tiny")
    assert config["max_batch_size"] == 8
    assert config["input"][0] == {"name": "input_ids", "data_type": "TYPE_INT64", "dims": [-1]}
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]


@pytest.mark.parametrize("binary", [True, False])
def test_infer_equals_the_bundle_run_directly(server, bundles, binary):
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 1000, size=(2, 7), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1, 5:] = 0
    outputs = [tritonclient_http.InferRequestedOutput("last_hidden_state", binary_data=binary)]
    result = server["client"].infer("tiny", _inputs(ids, mask, binary), outputs=outputs, request_id="r1")
    expected = direct(bundles["tiny"], {"input_ids": ids, "attention_mask": mask})["last_hidden_state"]
    np.testing.assert_array_equal(result.as_numpy("last_hidden_state"), expected)
    response = result.get_response()
    assert response["id"] == "r1" and response["parameters"]["attention_window"] is None


@pytest.mark.parametrize("binary", [True, False])
def test_fp16_bool_int32_tensors(server, bundles, binary):
    rng = np.random.default_rng(5)
    feeds = {"half": rng.standard_normal((3, 4)).astype(np.float16), "flag": rng.random((3, 4)) > 0.5,
             "count": rng.integers(-100, 100, size=(3, 4), dtype=np.int32)}
    inputs = []
    for name, array in feeds.items():
        datatype = {"float16": "FP16", "bool": "BOOL", "int32": "INT32"}[array.dtype.name]
        inputs.append(tritonclient_http.InferInput(name, list(array.shape), datatype))
        inputs[-1].set_data_from_numpy(array, binary_data=binary)
    names = ("half_x2", "not_flag", "count_plus_1")
    outputs = [tritonclient_http.InferRequestedOutput(n, binary_data=binary) for n in names]
    result = server["client"].infer("dtypes", inputs, outputs=outputs)
    expected = direct(bundles["dtypes"], feeds)
    for name in names:
        got = result.as_numpy(name)
        assert got.dtype == expected[name].dtype
        np.testing.assert_array_equal(got, expected[name])
    np.testing.assert_array_equal(result.as_numpy("not_flag"), ~feeds["flag"])


def test_window_is_live_and_reported(server, bundles, runner):
    from edgeattn.cli.main import cli

    ids = np.arange(6, dtype=np.int64).reshape(1, 6)
    infer_input = tritonclient_http.InferInput("input_ids", [1, 6], "INT64")
    infer_input.set_data_from_numpy(ids)
    url = "http://" + server["url"]
    try:
        for window in (0, 16, 3):
            done = runner.invoke(cli, ["window", "set", str(window), "--url", url])
            assert done.exit_code == 0, done.output
            result = server["client"].infer("windowed", [infer_input])
            assert result.get_response()["parameters"]["attention_window"] == window
            expected = direct(bundles["windowed"], {"input_ids": ids, "attention_window": np.array(window)})
            np.testing.assert_array_equal(result.as_numpy("hidden"), expected["hidden"])
        assert runner.invoke(cli, ["window", "lock", "4", "--url", url]).exit_code == 0
        refused = runner.invoke(cli, ["window", "set", "9", "--url", url])
        assert refused.exit_code != 0 and "locked at 4" in refused.output
        assert not server["window"].set(9, source="controller")  # the controller is held off too
        assert server["client"].infer("windowed", [infer_input]).get_response()["parameters"]["attention_window"] == 4
        shown = runner.invoke(cli, ["window", "get", "--url", url])
        assert "window 4" in shown.output and "locked" in shown.output
    finally:
        assert runner.invoke(cli, ["window", "unlock", "--url", url]).exit_code == 0
        server["window"].set(0)


def test_client_may_not_send_the_window(server):
    inputs = [tritonclient_http.InferInput("input_ids", [1, 2], "INT64"),
              tritonclient_http.InferInput("attention_window", [], "INT64")]
    inputs[0].set_data_from_numpy(np.zeros((1, 2), np.int64))
    inputs[1].set_data_from_numpy(np.array(5, np.int64))
    with pytest.raises(tritonclient_http.InferenceServerException, match="admin endpoint"):
        server["client"].infer("windowed", inputs)


def _json_request(ids, mask=None, dtype="INT64", shape=None) -> bytes:
    inputs = [{"name": "input_ids", "datatype": dtype, "shape": shape or list(np.shape(ids)),
               "data": np.asarray(ids).ravel().tolist()}]
    if mask is not None:
        inputs.append({"name": "attention_mask", "datatype": "INT64", "shape": list(np.shape(mask)),
                       "data": np.asarray(mask).ravel().tolist()})
    return json.dumps({"inputs": inputs}).encode()


def test_malformed_requests_get_4xx_and_the_server_keeps_serving(server):
    url, ok = server["url"], np.ones((1, 3), np.int64)
    binary = json.dumps({"inputs": [
        {"name": "input_ids", "datatype": "INT64", "shape": [1, 3], "parameters": {"binary_data_size": 24}},
        {"name": "attention_mask", "datatype": "INT64", "shape": [1, 3], "parameters": {"binary_data_size": 24}}]})
    cases = {
        "invalid JSON": ("/v2/models/tiny/infer", b"{not json", {}, 400, "not valid JSON"),
        "unknown model": ("/v2/models/nope/infer", _json_request(ok, ok), {}, 404, "unknown model"),
        "wrong shape": ("/v2/models/tiny/infer", _json_request(np.ones((1, 3, 1), np.int64), ok), {}, 400,
                        "dimensions"),
        "wrong dtype": ("/v2/models/tiny/infer", _json_request(ok.astype(np.int32), ok, dtype="INT32"), {}, 400,
                        "expected datatype INT64, found INT32"),
        "missing input": ("/v2/models/tiny/infer", _json_request(ok), {}, 400, "missing input"),
        "mismatched dims": ("/v2/models/tiny/infer", _json_request(ok, np.ones((1, 4), np.int64)), {}, 400,
                            "input 'input_ids' has 3"),
        "too few values": ("/v2/models/tiny/infer", _json_request([1, 2], ok, shape=[1, 3]), {}, 400,
                           "needs 3 values"),
        "binary size mismatch": ("/v2/models/tiny/infer", binary.encode() + bytes(40),
                                 {"Inference-Header-Content-Length": str(len(binary))}, 400, "expected 24 bytes"),
        "oversized body": ("/v2/models/tiny/infer", b" " * (2 << 20), {}, 413, "body"),
        "sequence out of range": ("/v2/models/tiny/infer", _json_request(np.ones((1, 40), np.int64),
                                                                         np.ones((1, 40), np.int64)), {}, 400,
                                  "expected 1..32"),
    }
    for what, (path, body, headers, status, message) in cases.items():
        got, doc = _post(url, path, body, headers)
        assert got == status, (what, got, doc)
        assert message in doc["error"], (what, doc)
    result = server["client"].infer("tiny", _inputs(ok, ok, True))
    assert result.as_numpy("last_hidden_state").shape == (1, 3, 16)


def test_concurrent_clients_get_their_own_answers(server, bundles):
    """8 clients x 50 requests, mixed sequence lengths: every answer is the client's own."""
    clients, per_client, errors, mixed = 8, 50, [], []
    rng = np.random.default_rng(7)
    work = []
    for c in range(clients):
        ids = rng.integers(0, 1000, size=(1, 4 + c % 3), dtype=np.int64)
        mask = np.ones_like(ids)
        work.append((ids, mask, direct(bundles["tiny"], {"input_ids": ids, "attention_mask": mask})))

    def client_loop(c: int) -> None:
        ids, mask, expected = work[c]
        client = tritonclient_http.InferenceServerClient(server["url"])
        for _ in range(per_client):
            try:
                got = client.infer("tiny", _inputs(ids, mask, True)).as_numpy("last_hidden_state")
            except Exception as exc:  # counted, then asserted below
                errors.append(repr(exc))
                continue
            if not np.array_equal(got, expected["last_hidden_state"]):
                mixed.append(c)
        client.close()

    threads = [threading.Thread(target=client_loop, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not mixed
    stats = server["client"].get_inference_statistics("tiny")["model_stats"][0]
    assert max(b["batch_size"] for b in stats["batch_stats"]) > 1  # requests were stacked


def test_metrics(server):
    server["client"].infer("tiny", _inputs(np.ones((1, 2), np.int64), np.ones((1, 2), np.int64), True))
    host, port = server["url"].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    for line in ('edgeattn_requests_total{model="tiny",status="success"}',
                 'edgeattn_request_latency_seconds_bucket{le="0.001",model="tiny"}',
                 "edgeattn_queue_time_seconds_count", "edgeattn_batch_size_bucket",
                 "edgeattn_attention_window 0.0",
                 'edgeattn_device_temperature_celsius{sensor="gpu-thermal"} 61.5',
                 'edgeattn_device_power_watts{sensor="VDD_IN"} 7.25', "edgeattn_device_throttled 1.0"):
        assert line in text, line
    assert server["controller"].started == 1
