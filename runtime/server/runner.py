"""Running the app: in the foreground with signal handling, or in a background thread (tests, benchmarks)."""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web

from edgeattn.errors import RuntimeBackendError


def serve_forever(app: web.Application, host: str, port: int, *, shutdown_timeout: float = 30.0,
                  print_fn=print) -> None:
    """Serve until SIGINT/SIGTERM; then stop accepting, finish in-flight requests, release the models."""
    web.run_app(app, host=host, port=port, shutdown_timeout=shutdown_timeout, print=print_fn,
                access_log=None)


class BackgroundServer:
    """The app on its own event loop in a daemon thread. `with BackgroundServer(app) as url: ...`"""

    def __init__(self, app: web.Application, host: str = "127.0.0.1", port: int = 0,
                 shutdown_timeout: float = 10.0) -> None:
        self.app, self.host, self.port = app, host, port
        self.shutdown_timeout = shutdown_timeout
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="edgeattn-serve", daemon=True)

    @property
    def url(self) -> str:
        return f"{self.host}:{self.port}"

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, shutdown_timeout=self.shutdown_timeout)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def start(self) -> "BackgroundServer":
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=60)
        except OSError as exc:
            raise RuntimeBackendError(f"cannot listen on {self.host}:{self.port}: {exc}") from None
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(
                timeout=self.shutdown_timeout + 30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> str:
        return self.start().url

    def __exit__(self, *exc) -> None:
        self.stop()
