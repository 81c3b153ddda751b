"""`edgeattn serve` as a process: ready over HTTP, answers, SIGTERM exits cleanly; option errors."""

from __future__ import annotations

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
