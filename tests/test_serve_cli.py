"""`edgeattn serve` as a process: ready over HTTP, answers, SIGTERM exits cleanly; option errors."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytest.importorskip("aiohttp")

from edgeattn.cli.main import cli  # noqa: E402
from serve_support import tiny_bundle  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_serve_process_starts_renames_and_stops_on_sigterm(tmp_path):
    bundle = tiny_bundle(tmp_path)
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "edgeattn.cli.main", "serve", str(bundle.path), "--port",
                             str(port), "--name", "renamed", "--window", "5"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if _get(base + "/v2/health/ready")[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
        assert _get(base + "/v2/models/renamed")[1]["name"] == "renamed"
        assert _get(base + "/v2/models/tiny")[0] == 404
        assert _get(base + "/v2/admin/window")[1]["window"] == 5
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def test_name_needs_exactly_one_bundle(tmp_path, runner):
    bundle = tiny_bundle(tmp_path)
    result = runner.invoke(cli, ["serve", str(bundle.path), str(bundle.path), "--name", "x"])
    assert result.exit_code != 0 and "--name names one bundle" in result.output


def test_window_cli_says_when_no_server_answers(runner):
    result = runner.invoke(cli, ["window", "get", "--url", f"http://127.0.0.1:{_free_port()}"])
    assert result.exit_code == 6 and "cannot reach the server" in result.output


def test_load_script_runs_both_modes_and_finds_no_mixups(tmp_path):
    import pathlib

    bundle = tiny_bundle(tmp_path)
    script = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "serve_load.py"
    proc = subprocess.run([sys.executable, str(script), str(bundle.path), "--clients", "3", "--requests", "4",
                           "--rounds", "2", "--seq", "5", "--max-batch", "4"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r["mode"] for r in summary["results"]] == ["batch-1", "batched (max 4, 2 ms)"]
    for r in summary["results"]:
        assert r["answered"] == 12 and r["errors"] == 0 and r["mixups"] == 0
    assert "batching:" in proc.stdout


TESTS = str(__import__("pathlib").Path(__file__).resolve().parent)


def _wait_ready(base: str, proc, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            if _get(base + "/v2/health/ready")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError("server did not become ready")


def _slow_server(bundle, port: int, seconds: float, shutdown_timeout: float):
    import os

    code = (f"import serve_support; serve_support.slow_server_main({str(bundle.path)!r}, {port}, {seconds}, "
            f"{shutdown_timeout})")
    env = {**os.environ, "PYTHONPATH": TESTS + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def _infer_status(base: str) -> int | str:
    body = json.dumps({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 2], "data": [1, 2]},
                                  {"name": "attention_mask", "datatype": "INT64", "shape": [1, 2],
                                   "data": [1, 1]}]}).encode()
    request = urllib.request.Request(base + "/v2/models/slow/infer", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError as exc:
        return type(exc).__name__


@contextlib.contextmanager
def _queued_slow_server(tmp_path, shutdown_timeout: float, statuses: list):
    """A slow server (0.5 s a request, one worker) with 8 requests queued on it, their statuses appended to
    `statuses`. Yields (base URL, process); on the way out a live process is killed and the requests joined."""
    import threading

    bundle = tiny_bundle(tmp_path)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = _slow_server(bundle, port, seconds=0.5, shutdown_timeout=shutdown_timeout)
    threads: list = []
    try:
        _wait_ready(base, proc)
        threads = [threading.Thread(target=lambda: statuses.append(_infer_status(base))) for _ in range(8)]
        for t in threads:
            t.start()
        time.sleep(0.3)  # 8 requests queued: 4 s of work on one worker
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        for t in threads:
            t.join(timeout=30)


def test_sigterm_answers_503_then_abandons_the_queue_after_the_timeout(tmp_path):
    statuses: list = []
    with _queued_slow_server(tmp_path, 1.0, statuses) as (base, proc):
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        assert _infer_status(base) == 503  # a request after SIGTERM: refused politely, not reset
        assert _get(base + "/v2/health/ready")[0] == 503
        out, err = proc.communicate(timeout=60)  # a hang guard, not a measurement
    assert proc.returncode == 0, err
    # 4 s of queued work against a 1 s timeout: the queue was abandoned (503), what ran was answered
    assert 200 in statuses and 503 in statuses and set(statuses) <= {200, 503}, statuses
    assert "Traceback" not in err


def test_a_second_sigterm_stops_at_once_without_a_traceback(tmp_path):
    with _queued_slow_server(tmp_path, 600.0, []) as (base, proc):
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        # a hang guard far below the 600 s shutdown timeout: only the second signal can end it in time
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    assert "again: answering the queued requests 503" in out, out


def test_a_burst_of_sigterms_ends_an_idle_server_cleanly(tmp_path):
    """SIGTERM every few ms until the process is gone: none of them may kill it (exit -15) or leave a
    traceback, whether it lands while the server stops or while the process exits."""
    bundle = tiny_bundle(tmp_path)
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "edgeattn.cli.main", "serve", str(bundle.path), "--port",
                             str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_ready(f"http://127.0.0.1:{port}", proc)
        deadline = time.monotonic() + 60  # a hang guard
        while proc.poll() is None and time.monotonic() < deadline:
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.005)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (proc.returncode, err)
    assert "Traceback" not in err, err


def test_a_model_that_fails_to_load_ends_the_process_with_the_reason(tmp_path):
    from edgeattn.bundle.manifest import MANIFEST_NAME, Manifest

    bundle = tiny_bundle(tmp_path)
    bundle.artifact.write_bytes(b"not a model at all" * 100)
    # the bundle stays consistent (re-hashed), so only loading it can tell
    manifest = Manifest.from_json((bundle.path / MANIFEST_NAME).read_text())
    manifest.hash_files(bundle.path, list(manifest.files))
    (bundle.path / MANIFEST_NAME).write_text(manifest.to_json())
    proc = subprocess.run([sys.executable, "-m", "edgeattn.cli.main", "serve", str(bundle.path), "--port",
                           str(_free_port())], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 6, proc.stderr
    assert "could not load" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("value", [str(2**63), "33"])
def test_serve_refuses_a_window_beyond_the_bundle_before_starting(tmp_path, runner, value):
    from serve_support import make_bundle, window_model

    windowed = make_bundle(tmp_path, window_model(), "windowed")
    result = runner.invoke(cli, ["serve", str(windowed.path), "--window", value, "--port", str(_free_port())])
    assert result.exit_code == 2, result.output
    assert "--window" in result.output and "0..32" in result.output
