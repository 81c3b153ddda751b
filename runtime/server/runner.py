"""Running the app: in the foreground with signal handling, or in a background thread (tests, benchmarks)."""

from __future__ import annotations

import asyncio
import signal
import threading

from aiohttp import web

from edgeattn.errors import EdgeAttnError, RuntimeBackendError
from edgeattn.runtime.server.app import STARTUP, abandon, drain

CLOSE_GRACE_S = 1.0  # after the queues are drained: how long open connections get to finish their answers
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def serve_forever(app: web.Application, host: str, port: int, *, shutdown_timeout: float = 30.0,
                  print_fn=print) -> None:
    """Serve until SIGINT/SIGTERM, or raise RuntimeBackendError if a model fails to start.

    The first signal stops the models taking requests (ready and inference answer 503 while the server
    still listens), lets the queued requests finish for up to `shutdown_timeout` s (the rest get 503),
    then closes. A second signal answers the queued requests 503 at once. Once the server has stopped,
    SIGINT and SIGTERM stay ignored: the process is on its way out, and a repeated signal must not kill it
    half-way (with the signal's exit status, or a KeyboardInterrupt traceback); a caller that goes on
    doing other work installs its own handlers again."""
    try:
        asyncio.run(_serve(app, host, port, shutdown_timeout, print_fn))
    finally:
        _ignore_stop_signals()


def _ignore_stop_signals() -> None:
    """SIG_IGN for SIGINT and SIGTERM. Not a Python handler: the interpreter resets those to the default
    action while it finalizes, and a signal then would still kill the process."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


async def _serve(app: web.Application, host: str, port: int, shutdown_timeout: float, print_fn) -> None:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()

    def on_signal(name: str) -> None:
        if stopping.is_set():
            print_fn(f"{name} again: answering the queued requests 503")
            abandon(app)
            return
        print_fn(f"{name}: finishing queued requests (up to {shutdown_timeout:g} s), then stopping")
        stopping.set()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig.name)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=CLOSE_GRACE_S)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            raise RuntimeBackendError(f"cannot listen on {host}:{port}: {exc}") from None
        print_fn(f"listening on http://{host}:{port} (Ctrl-C or SIGTERM to stop)")
        startup = app[STARTUP].task
        stop = asyncio.ensure_future(stopping.wait())
        await asyncio.wait([startup, stop], return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if startup.done() and not startup.cancelled() and startup.exception() is not None:
            error = startup.exception()
            if not isinstance(error, EdgeAttnError):
                error = RuntimeBackendError(f"start-up failed: {type(error).__name__}: {error}")
            raise error
        await stopping.wait()
        await drain(app, shutdown_timeout)
    finally:
        await runner.cleanup()
        for sig in STOP_SIGNALS:  # removing a handler restores the default action (death by the signal):
            loop.remove_signal_handler(sig)  # ignore the signal at once instead, until the process exits
            signal.signal(sig, signal.SIG_IGN)


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
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=self.shutdown_timeout)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
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
