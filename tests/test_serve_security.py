"""The admin routes: the window is bounded, only same-origin JSON (and the token, when set) may change it,
and its history stays small. A real server on 127.0.0.1 and real bundles."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("aiohttp")

from edgeattn.cli.main import cli  # noqa: E402
from edgeattn.errors import ConfigError  # noqa: E402
from edgeattn.runtime.live_window import HISTORY_LENGTH, REASON_CHARS, LiveWindow  # noqa: E402
from edgeattn.runtime.server.app import create_app  # noqa: E402
from edgeattn.runtime.server.runner import BackgroundServer  # noqa: E402
from edgeattn.runtime.server.settings import ServeSettings  # noqa: E402
from serve_support import JSON, http, make_bundle, wait_ready_http, window_model  # noqa: E402

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return make_bundle(tmp_path_factory.mktemp("security"), window_model(), "windowed")


class _server:
    """A started server for `bundle`, ready: `with _server(bundle, admin_token=...) as url`."""

    def __init__(self, bundle, **settings) -> None:
        app = create_app([bundle], ServeSettings(port=0, warmup_runs=0, **settings), sensors=False)
        self.server = BackgroundServer(app)

    def __enter__(self) -> str:
        url = self.server.start().url
        wait_ready_http(url)
        return url

    def __exit__(self, *exc) -> None:
        self.server.stop()


@pytest.fixture(scope="module")
def server(bundle):
    with _server(bundle) as url:
        yield url


def _infer(url: str) -> tuple[int, dict]:
    body = json.dumps({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 3],
                                   "data": [1, 2, 3]}]}).encode()
    status, doc, _ = http(url, "POST", "/v2/models/windowed/infer", body, JSON)
    return status, doc


@pytest.mark.parametrize("path", ["/v2/admin/window", "/v2/admin/window/lock"])
@pytest.mark.parametrize("value", [2**63, 2**64 + 5, 33, -1, 1.5, "8", True])
def test_window_beyond_the_bundle_is_refused_and_inference_keeps_working(server, path, value):
    status, doc, _ = http(server, "POST", path, json.dumps({"window": value}).encode(), JSON)
    assert status == 400, doc
    assert "window" in doc["error"]
    if isinstance(value, int) and not isinstance(value, bool) and value > 32:
        assert "0..32" in doc["error"]
    state = http(server, "GET", "/v2/admin/window")[1]
    assert state["window"] == 0 and not state["locked"]
    status, doc = _infer(server)
    assert status == 200 and doc["parameters"]["attention_window"] == 0


def test_window_at_the_bundle_maximum_is_accepted(server):
    try:
        status, doc, _ = http(server, "POST", "/v2/admin/window", b'{"window": 32}', JSON)
        assert status == 200 and doc["window"] == 32
        status, doc = _infer(server)
        assert status == 200 and doc["parameters"]["attention_window"] == 32
    finally:
        http(server, "POST", "/v2/admin/window", b'{"window": 0}', JSON)


def test_live_window_bounds_and_history():
    window = LiveWindow(0, max_window=64)
    with pytest.raises(ConfigError, match=r"0\.\.64"):
        window.set(65)
    with pytest.raises(ConfigError, match=r"0\.\.64"):
        LiveWindow(2**63, max_window=64)
    for i in range(3 * HISTORY_LENGTH):
        window.set(i % 2 + 1, reason="r" * (2 * REASON_CHARS))
    assert len(window.history) == HISTORY_LENGTH
    assert all(len(c.reason) <= REASON_CHARS for c in window.history)


@pytest.mark.parametrize("headers, status", [
    ({"Content-Type": "text/plain"}, 415),
    ({}, 415),
    ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
    ({**JSON, "Origin": "http://evil.example"}, 403),
    ({**JSON, "Origin": "null"}, 403),
    ({**JSON, "Sec-Fetch-Site": "cross-site"}, 403),
    ({**JSON, "Host": "rebound.example:8000"}, 403),  # DNS rebinding: a page's own name, our address
])
def test_admin_refuses_what_a_web_page_can_send(server, headers, status):
    for path in ("/v2/admin/window", "/v2/admin/window/lock", "/v2/admin/window/unlock"):
        got, doc, _ = http(server, "POST", path, b'{"window": 7}', headers)
        assert got == status, (path, got, doc)
    state = http(server, "GET", "/v2/admin/window")[1]
    assert state["window"] == 0 and not state["locked"] and all(h["new"] != 7 for h in state["history"])


def test_same_origin_json_is_accepted(server):
    host = server
    try:
        got, doc, _ = http(server, "POST", "/v2/admin/window", b'{"window": 5}',
                           {**JSON, "Origin": f"http://{host}"})
        assert got == 200 and doc["window"] == 5
    finally:
        http(server, "POST", "/v2/admin/window", b'{"window": 0}', JSON)


def test_history_and_reason_stay_small(bundle):
    with _server(bundle) as url:
        for i in range(HISTORY_LENGTH + 10):
            body = json.dumps({"window": i % 2 + 1, "reason": "x" * 100_000}).encode()
            got, doc, _ = http(url, "POST", "/v2/admin/window", body, JSON)
            assert got == 200, doc
        history = http(url, "GET", "/v2/admin/window")[1]["history"]
        assert 0 < len(history) <= HISTORY_LENGTH
        assert max(len(h["reason"]) for h in history) <= REASON_CHARS


def test_admin_token(bundle, runner, monkeypatch):
    with _server(bundle, admin_token=TOKEN) as url:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            got, doc, _ = http(url, "POST", "/v2/admin/window", b'{"window": 3}', {**JSON, **headers})
            assert got == 401, (headers, got, doc)
            assert http(url, "GET", "/v2/admin/window", headers=headers)[0] == 401
        got, doc, _ = http(url, "POST", "/v2/admin/window", b'{"window": 3}',
                           {**JSON, "Authorization": f"Bearer {TOKEN}"})
        assert got == 200 and doc["window"] == 3
        # inference and health need no token
        assert _infer(url)[0] == 200 and http(url, "GET", "/v2/health/ready")[0] == 200
        # the CLI: refused without the token, accepted with --admin-token or the environment
        refused = runner.invoke(cli, ["window", "get", "--url", f"http://{url}"])
        assert refused.exit_code == 2 and "HTTP 401" in refused.output
        done = runner.invoke(cli, ["window", "set", "4", "--url", f"http://{url}", "--admin-token", TOKEN])
        assert done.exit_code == 0 and "window 4" in done.output, done.output
        monkeypatch.setenv("EDGEATTN_SERVE_ADMIN_TOKEN", TOKEN)
        done = runner.invoke(cli, ["window", "get", "--url", f"http://{url}"])
        assert done.exit_code == 0 and "window 4" in done.output, done.output


def test_admin_token_from_the_environment():
    settings = ServeSettings.from_env({"EDGEATTN_SERVE_ADMIN_TOKEN": TOKEN})
    assert settings.admin_token == TOKEN
    assert TOKEN not in repr(settings)


def test_window_parameter_in_a_request_is_refused(server):
    body = json.dumps({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 2], "data": [1, 2]}],
                       "parameters": {"attention_window": 4}}).encode()
    got, doc, _ = http(server, "POST", "/v2/models/windowed/infer", body, JSON)
    assert got == 400 and "/v2/admin/window" in doc["error"], doc
    assert np.isscalar(http(server, "GET", "/v2/admin/window")[1]["window"])
