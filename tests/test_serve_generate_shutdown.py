"""SIGTERM with generation streams in flight: `edgeattn serve` stops admitting, ends every stream with a final
chunk that carries a finish reason and `data: [DONE]`, and exits 0."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("aiohttp")

from decoder_fixtures import requires_decoder_stack  # noqa: E402
from serve_support import next_event, open_stream, post_json, wait_ready_http  # noqa: E402

pytestmark = requires_decoder_stack


def _wait_ready(url: str, proc) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            wait_ready_http(url, timeout=5)
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"the server did not become ready: {proc.poll()=}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


BODY = {"model": "dec", "prompt": "Once upon a time", "temperature": 0, "max_tokens": 512, "stream": True}


def _serve_and_stream(tiny_decoder, extra: list[str], during):
    """Start `edgeattn serve` on the tiny decoder, open a 512-token stream, call `during(url, proc, first_event)`
    (which sends SIGTERM), read the stream to its end; returns (events, stderr, exit code)."""
    port = _free_port()
    url = f"127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "edgeattn.cli.main", "serve", str(tiny_decoder[3]), "--port",
                             str(port), "--name", "dec", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        _wait_ready(url, proc)
        conn, response = open_stream(url, "/v1/completions", BODY)
        during(url, proc, next_event(response))
        events = []
        while (event := next_event(response)) is not None:
            events.append(event)
        conn.close()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return events, err, proc.returncode


@pytest.mark.parametrize("timeout,finish", [(0, "abort"), (20, "length")])
def test_sigterm_ends_streams_in_flight_with_a_finish_reason(tiny_decoder, timeout, finish):
    def sigterm(url, proc, first):
        # 512 tokens: still running at SIGTERM (timeout 0), finished within 20 s
        assert first["choices"][0]["finish_reason"] is None
        proc.send_signal(signal.SIGTERM)

    events, err, code = _serve_and_stream(tiny_decoder, ["--slots", "2", "--shutdown-timeout", str(timeout)], sigterm)
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"][0]["finish_reason"] == finish
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-2])
    assert code == 0, err
    assert "Traceback" not in err, err


def test_requests_after_sigterm_are_refused_while_streams_finish(tiny_decoder):
    def sigterm_then_post(url, proc, first):
        assert first is not None
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        status, doc, _ = post_json(url, "/v1/completions", {**BODY, "stream": False})
        assert status == 503 and doc["error"]["type"] == "service_unavailable", doc

    events, err, code = _serve_and_stream(tiny_decoder, ["--shutdown-timeout", "30"], sigterm_then_post)
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] in ("length", "stop")
    assert code == 0, err
