"""A request header that trickles in, or never comes, is cut off after the header timeout (slow clients must not
hold connections forever). A real server on 127.0.0.1; closure is asserted, never how long it took."""

from __future__ import annotations

import select
import socket
import time

import pytest

pytest.importorskip("aiohttp")

from edgeattn.errors import ConfigError  # noqa: E402
from edgeattn.runtime.server.app import create_app  # noqa: E402
from edgeattn.runtime.server.runner import BackgroundServer  # noqa: E402
from edgeattn.runtime.server.settings import ServeSettings  # noqa: E402
from serve_support import http, tiny_bundle, wait_ready_http  # noqa: E402


def _closed_while_trickling(url: str, guard_s: float = 60.0) -> bool:
    """Send a request line and then one header byte at a time, never finishing the header: True once the
    server closes the connection (within `guard_s`, a hang guard)."""
    host, port = url.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        deadline = time.monotonic() + guard_s
        while time.monotonic() < deadline:
            try:
                s.sendall(b"a")
                if select.select([s], [], [], 0.05)[0] and s.recv(4096) == b"":
                    return True
            except OSError:  # reset by the server
                return True
    return False


@pytest.fixture(scope="module")
def impatient(tmp_path_factory):
    """An encoder server that waits 0.5 s for a request header."""
    settings = ServeSettings(port=0, warmup_runs=0, header_timeout_s=0.5)
    app = create_app([tiny_bundle(tmp_path_factory.mktemp("impatient"))], settings, sensors=False)
    with BackgroundServer(app) as url:
        wait_ready_http(url)
        yield url


def test_a_header_that_trickles_in_is_cut_off(impatient):
    assert _closed_while_trickling(impatient)
    assert http(impatient, "GET", "/v2/health/live")[0] == 200  # the server itself goes on


def test_a_connection_that_never_sends_is_closed(impatient):
    host, port = impatient.split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:  # the timeout: a hang guard
        try:
            assert s.recv(1) == b""
        except ConnectionResetError:
            pass


def test_header_timeout_setting_is_checked():
    assert ServeSettings.from_env({"EDGEATTN_SERVE_HEADER_TIMEOUT_S": "2.5"}).header_timeout_s == 2.5
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match="header_timeout_s: expected a number of seconds > 0"):
            ServeSettings(header_timeout_s=bad)
    with pytest.raises(ConfigError, match="max_generate_body_bytes: expected >= 1"):
        ServeSettings(max_generate_body_bytes=0)
