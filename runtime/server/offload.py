"""Large JSON work off the event loop: decoding big request bodies and encoding big JSON responses.

`json.loads` and `json.dumps` hold the GIL for their whole run, so a thread would stall the event loop
just the same (a 44 MB body: 2.1 s without a single health answer). Work above OFFLOAD_BYTES (body) or
OFFLOAD_VALUES (response values written as JSON) runs in one worker process, started on first use;
smaller work stays on the loop, where it takes well under a millisecond.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import signal
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np

from edgeattn.runtime.server.kserve import InferRequest, ProtocolError, encode_response, parse_request

OFFLOAD_BYTES = 256 << 10  # JSON request bodies larger than this are decoded in the worker process
OFFLOAD_VALUES = 1 << 15  # responses writing more values than this as JSON are encoded there


def _ignore_stop_signals() -> None:
    """In the worker: Ctrl-C (sent to the whole process group) and SIGTERM are the server's to handle;
    the server ends the worker with close()."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class JsonWorker:
    """One worker process for JSON decoding and encoding; `close()` ends it."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    async def _run(self, fn, *args):
        if self._pool is None:  # spawn: the server process has backend threads, which fork must not copy
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_ignore_stop_signals)
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        except BrokenProcessPool:  # the worker died (killed, out of memory): the next request starts another
            self._pool = None
            raise ProtocolError("the JSON worker process stopped while decoding or encoding this request; "
                                "retry (binary tensors avoid it)", 503) from None

    async def parse(self, body: bytes, header_length: str | None, json_bytes: int) -> InferRequest:
        if json_bytes <= OFFLOAD_BYTES:
            return parse_request(body, header_length)
        return await self._run(parse_request, body, header_length)

    async def encode(self, model: str, version: str, request: InferRequest, outputs: dict[str, np.ndarray],
                     parameters: dict) -> tuple[bytes, dict[str, str]]:
        wanted = request.outputs
        as_json = sum(a.size for n, a in outputs.items()
                      if not (any(w.name == n and w.binary for w in wanted) if wanted else request.binary_output))
        if as_json <= OFFLOAD_VALUES:
            return encode_response(model, version, request, outputs, parameters)
        slim = dataclasses.replace(request, inputs={})  # the inputs are not needed to encode
        if wanted is not None:
            outputs = {w.name: outputs[w.name] for w in wanted}
        return await self._run(encode_response, model, version, slim, outputs, parameters)

    @property
    def pids(self) -> list[int]:
        """The worker's process id, once started (monitoring, tests)."""
        return [] if self._pool is None else [p.pid for p in self._pool._processes.values()]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
