"""Runs the `tritonserver` that the nvidia-pytriton wheel ships (Linux x86_64) on a model repository.

What it takes, as measured: the wheel's bundled libraries on LD_LIBRARY_PATH (`nvidia_pytriton.libs`), a
backend folder holding the Python backend with the stub for this Python's version copied in as
`python/triton_python_backend_stub`, and `--backend-directory` pointing there. The wheel has no onnxruntime
or TensorRT backend: export cpu bundles with `--cpu-backend python`.

    server = WheelServer.find()
    with server.start(repo, tmp / "backends", ServerPorts.free()) as running:
        running.wait_ready(timeout_s=60)
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from edgeattn.errors import ConfigError, RuntimeBackendError


@dataclass(frozen=True)
class ServerPorts:
    http: int
    grpc: int

    @classmethod
    def free(cls) -> "ServerPorts":
        """Two ports free on loopback now (the server binds them a moment later)."""
        sockets = [socket.socket() for _ in range(2)]
        try:
            for s in sockets:
                s.bind(("127.0.0.1", 0))
            return cls(*(s.getsockname()[1] for s in sockets))
        finally:
            for s in sockets:
                s.close()


@dataclass(frozen=True)
class WheelServer:
    """The server binary, its libraries and Python backend inside an installed nvidia-pytriton."""

    root: Path  # site-packages/pytriton/tritonserver

    @classmethod
    def find(cls) -> "WheelServer | None":
        """The installed wheel's server, or None when nvidia-pytriton is not installed."""
        import importlib.util

        spec = importlib.util.find_spec("pytriton")
        if spec is None or not spec.submodule_search_locations:
            return None
        root = Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
        return cls(root) if (root / "bin" / "tritonserver").is_file() else None

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def libraries(self) -> Path:
        return self.root.parents[1] / "nvidia_pytriton.libs"

    def stub(self, python: str = f"{sys.version_info[0]}.{sys.version_info[1]}") -> Path:
        path = self.root / "python_backend_stubs" / python / "triton_python_backend_stub"
        if not path.is_file():
            found = sorted(p.name for p in (self.root / "python_backend_stubs").iterdir())
            raise ConfigError(f"no Python-backend stub for Python {python} in {self.root}: found {found}")
        return path

    def backends(self, folder: Path, python: str | None = None) -> Path:
        """`folder`/python: the wheel's Python backend with the stub for `python` (default: this Python)."""
        target = Path(folder) / "python"
        shutil.copytree(self.root / "backends" / "python", target, dirs_exist_ok=True)
        shutil.copy2(self.stub(python) if python else self.stub(), target / "triton_python_backend_stub")
        return Path(folder)

    def command(self, repo: Path, backend_dir: Path, ports: ServerPorts) -> list[str]:
        return [str(self.binary), f"--model-repository={Path(repo).absolute()}",
                f"--backend-directory={Path(backend_dir).absolute()}", f"--http-port={ports.http}",
                f"--grpc-port={ports.grpc}", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
                "--allow-metrics=false", "--exit-timeout-secs=5"]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(self.libraries), env.get("LD_LIBRARY_PATH")) if p)
        return env

    def start(self, repo: Path, backend_dir: Path, ports: ServerPorts, log: Path | None = None) -> "RunningServer":
        out = open(log, "wb") if log else subprocess.DEVNULL
        process = subprocess.Popen(self.command(repo, backend_dir, ports), env=self.environment(), stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        if log:
            out.close()  # the server holds its own descriptor
        return RunningServer(process, ports, log)


class RunningServer:
    """A started server: `wait_ready`, then `stop` (SIGTERM, then SIGKILL); a context manager stops it."""

    def __init__(self, process: subprocess.Popen, ports: ServerPorts, log: Path | None) -> None:
        self.process, self.ports, self.log = process, ports, log

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.ports.http}"

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log and self.log.is_file() else ""

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeBackendError(f"tritonserver exited with {self.process.returncode} before it was "
                                          f"ready:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://{self.url}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        raise RuntimeBackendError(f"tritonserver was not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

    def stop(self, timeout_s: float = 15) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)  # the server and its backend stubs
                self.process.wait(timeout_s)
        return self.process.returncode

    def __enter__(self) -> "RunningServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
