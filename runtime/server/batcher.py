"""Dynamic batching per model: a bounded queue, stacking of compatible requests, one answer per request.

Policy: requests are stacked along the batch axis only when all their other dimensions are equal (same
sequence length), so a batched answer is the unbatched answer: nothing is padded, no mask semantics are
assumed. The first request of a batch waits at most `max_delay_s` for company; a batch holds at most
`max_batch` rows (a single larger request, within the bundle's range, runs alone). If a batch fails, its
requests are rerun one by one so that an error reaches only the request that caused it; then requests
run alone for ISOLATE_S, so a flood of failing requests costs one run each, not a batch plus a rerun.

`stop(timeout)` finishes the queue within `timeout` seconds; what is still queued then (or when
`abandon()` is called) is answered 503 and never run.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from edgeattn.runtime.server.kserve import ProtocolError

ISOLATE_S = 2.0  # after a stacked batch fails, requests run alone this long


@dataclass
class Outcome:
    """What one request gets back."""

    outputs: dict[str, np.ndarray]
    window: int | None
    queue_s: float
    compute_s: float
    batch_rows: int


@dataclass(eq=False)  # identity: the queue removes exactly this request
class _Pending:
    feeds: dict[str, np.ndarray]
    rows: int
    key: tuple  # non-batch shape of every input: requests with equal keys can be stacked
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)


class QueueFull(ProtocolError):
    def __init__(self, model: str, size: int) -> None:
        super().__init__(f"model {model!r}: the request queue is full ({size} waiting); retry later", 503)


# (feeds) -> (outputs, window used); runs in the model's worker thread
RunFn = Callable[[dict[str, np.ndarray]], tuple[dict[str, np.ndarray], int | None]]


class DynamicBatcher:
    def __init__(self, name: str, run: RunFn, *, max_batch: int, max_delay_s: float, max_queue: int,
                 on_batch: Callable[[int, float], None] = lambda rows, seconds: None) -> None:
        self.name = name
        self._run = run
        self.max_batch = max_batch
        self.max_delay_s = max_delay_s
        self.max_queue = max_queue
        self._on_batch = on_batch
        self._pending: deque[_Pending] = deque()
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self._closing = False
        self._abandoned: asyncio.Event | None = None
        self._isolate_until = 0.0  # perf_counter time; written by the worker thread, read by the loop
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"infer-{name}")

    @property
    def depth(self) -> int:
        return len(self._pending)

    def start(self) -> None:
        self._wakeup, self._abandoned = asyncio.Event(), asyncio.Event()
        self._worker = asyncio.get_running_loop().create_task(self._loop(), name=f"batcher-{self.name}")

    async def stop(self, timeout: float | None = None) -> None:
        """Refuse new requests, finish the queued ones within `timeout` s (None: all), then stop the worker.

        Requests still queued at the deadline get 503; the batch running then is awaited (a backend run
        cannot be interrupted)."""
        self._closing = True
        if self._worker is not None:
            self._wakeup.set()
            finished = asyncio.ensure_future(asyncio.shield(self._worker))
            abandoned = asyncio.ensure_future(self._abandoned.wait())
            await asyncio.wait([finished, abandoned], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            abandoned.cancel()
            self.abandon()
            await finished
        self._executor.shutdown(wait=True)

    def abandon(self) -> None:
        """Answer every queued request 503 now; the worker stops after the batch it is running."""
        self._closing = True
        while self._pending:
            item = self._pending.popleft()
            if not item.future.done():
                item.future.set_exception(ProtocolError(f"model {self.name!r} is shutting down: the request "
                                                        f"was not run", 503))
        if self._abandoned is not None:
            self._abandoned.set()
            self._wakeup.set()

    async def run_direct(self, fn: Callable, *args):
        """Run `fn` on the model's worker thread (activation, warm-up)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def submit(self, feeds: dict[str, np.ndarray], rows: int) -> Outcome:
        if self._closing:
            raise ProtocolError(f"model {self.name!r} is shutting down", 503)
        if len(self._pending) >= self.max_queue:
            raise QueueFull(self.name, len(self._pending))
        key = tuple((n, a.shape[1:]) for n, a in sorted(feeds.items()))
        item = _Pending(feeds, rows, key, asyncio.get_running_loop().create_future())
        self._pending.append(item)
        self._wakeup.set()
        return await item.future

    def _rows_like(self, key: tuple) -> int:
        return sum(p.rows for p in self._pending if p.key == key)

    def _isolating(self) -> bool:
        return time.perf_counter() < self._isolate_until

    def _take(self) -> list[_Pending]:
        first = self._pending.popleft()
        group, rows = [first], first.rows
        if self._isolating():
            return group
        for item in list(self._pending):
            if item.key == first.key and rows + item.rows <= self.max_batch:
                self._pending.remove(item)
                group.append(item)
                rows += item.rows
        return group

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            first = self._pending[0]
            deadline = first.enqueued + self.max_delay_s
            while (self.max_batch > 1 and not self._closing and not self._isolating()
                   and self._rows_like(first.key) < self.max_batch and time.perf_counter() < deadline):
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), max(0.0, deadline - time.perf_counter()))
                except asyncio.TimeoutError:
                    break
            group = self._take()
            started = time.perf_counter()
            try:
                results = await loop.run_in_executor(self._executor, self._execute, group)
            except Exception as exc:  # a bug in the batcher itself: fail this group, keep serving
                results = [exc] * len(group)
            for item, result in zip(group, results):
                if item.future.done():  # the client went away
                    continue
                if isinstance(result, BaseException):
                    item.future.set_exception(result)
                else:
                    outputs, window, compute_s, rows = result
                    item.future.set_result(Outcome(outputs, window, started - item.enqueued, compute_s, rows))

    def _execute(self, group: list[_Pending]) -> list:
        """Worker thread: run the group stacked; on failure run each request alone."""
        rows = sum(p.rows for p in group)
        t0 = time.perf_counter()
        try:
            if len(group) == 1:
                feeds = group[0].feeds
            else:
                feeds = {n: np.concatenate([p.feeds[n] for p in group], axis=0) for n in group[0].feeds}
            outputs, window = self._run(feeds)
            seconds = time.perf_counter() - t0
            self._on_batch(rows, seconds)
            if len(group) == 1:
                return [(outputs, window, seconds, rows)]
            return self._split(group, outputs, window, seconds, rows)
        except Exception as exc:
            if len(group) == 1:
                return [exc]
            self._isolate_until = time.perf_counter() + ISOLATE_S
            return [r for p in group for r in self._execute([p])]

    @staticmethod
    def _split(group: list[_Pending], outputs: dict[str, np.ndarray], window, seconds: float, rows: int) -> list:
        for name, array in outputs.items():
            if array.shape[:1] != (rows,):
                raise ValueError(f"output {name!r} has shape {list(array.shape)}: expected {rows} rows on axis 0")
        results, start = [], 0
        for p in group:
            part = {n: a[start:start + p.rows] for n, a in outputs.items()}
            results.append((part, window, seconds, rows))
            start += p.rows
        return results
