"""Start-up and shutdown: live at once, ready after warm-up; stopping finishes the requests in flight."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

tritonclient_http = pytest.importorskip("tritonclient.http")
pytest.importorskip("aiohttp")

from edgeattn.errors import ConfigError  # noqa: E402
from edgeattn.runtime.server.app import MODELS, create_app  # noqa: E402
from edgeattn.runtime.server.runner import BackgroundServer  # noqa: E402
from edgeattn.runtime.server.settings import ServeSettings  # noqa: E402
from serve_support import direct, tiny_bundle, wait_ready  # noqa: E402


def _slowed(model, seconds: float) -> None:
    infer = model.backend.infer

    def slow(feeds):
        time.sleep(seconds)
        return infer(feeds)

    model.backend.infer = slow


def test_ready_only_after_warm_up_and_graceful_shutdown(tmp_path):
    bundle = tiny_bundle(tmp_path)
    app = create_app([bundle], ServeSettings(port=0, max_batch=1, warmup_runs=1), names=["slow"], sensors=False)
    _slowed(app[MODELS]["slow"], 0.3)
    server = BackgroundServer(app).start()
    client = tritonclient_http.InferenceServerClient(server.url)
    assert client.is_server_live()
    assert not client.is_server_ready()  # the warm-up runs take 2 x 0.3 s
    wait_ready(client)
    ids = np.arange(4, dtype=np.int64).reshape(1, 4)
    expected = direct(bundle, {"input_ids": ids, "attention_mask": np.ones_like(ids)})["last_hidden_state"]
    results, errors = [], []

    def one_request() -> None:
        c = tritonclient_http.InferenceServerClient(server.url)
        inputs = [tritonclient_http.InferInput("input_ids", [1, 4], "INT64"),
                  tritonclient_http.InferInput("attention_mask", [1, 4], "INT64")]
        inputs[0].set_data_from_numpy(ids)
        inputs[1].set_data_from_numpy(np.ones_like(ids))
        try:
            results.append(c.infer("slow", inputs).as_numpy("last_hidden_state"))
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one_request) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.2)  # all three are in flight; they need 0.9 s on one worker
    server.stop()
    for t in threads:
        t.join(timeout=30)
    assert not errors and len(results) == 3
    for got in results:
        np.testing.assert_array_equal(got, expected)


def test_settings_validate_and_read_the_environment():
    with pytest.raises(ConfigError, match="max_batch"):
        ServeSettings(max_batch=0)
    settings = ServeSettings.from_env({"EDGEATTN_SERVE_MAX_BATCH": "16", "EDGEATTN_SERVE_PORT": "9000"}, port=0)
    assert settings.max_batch == 16 and settings.port == 0
    with pytest.raises(ConfigError, match="EDGEATTN_SERVE_MAX_QUEUE"):
        ServeSettings.from_env({"EDGEATTN_SERVE_MAX_QUEUE": "many"})


def test_names_must_be_unique(tmp_path):
    bundle = tiny_bundle(tmp_path)
    with pytest.raises(ConfigError, match="unique"):
        create_app([bundle, bundle], ServeSettings(port=0), sensors=False)
