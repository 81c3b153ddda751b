"""An `edgeattn serve` process for the load benchmarks: a free loopback port, start, wait until ready."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def start_serve(serve_args: list[str], port: int, threads: int = 0, ready_s: float = 120) -> subprocess.Popen:
    """`edgeattn serve SERVE_ARGS --host 127.0.0.1 --port PORT [--threads N]`, returned once /v2/health/ready is 200."""
    cmd = [sys.executable, "-m", "edgeattn.cli.main", "serve", *serve_args, "--host", HOST, "--port", str(port)]
    if threads:
        cmd += ["--threads", str(threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + ready_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {proc.stderr.read()}")
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit(f"server did not become ready within {ready_s:.0f} s")
