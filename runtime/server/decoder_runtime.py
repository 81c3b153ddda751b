"""A decoder bundle at run time in the service: the model, its slot scheduler, admission and per-request streams.

`submit` turns a validated request (prompt token ids, limits, sampling) into a scheduler job and returns a
`Stream`: an asyncio queue of the job's events. Every event is delivered on the event loop, in one call per
scheduler iteration.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass

from edgeattn.bundle.folder import Bundle
from edgeattn.errors import ConfigError, EdgeAttnError, RuntimeBackendError
from edgeattn.runtime.cuda import devices as gpu_devices
from edgeattn.runtime.cuda.bundle import is_cuda_bundle, slot_plan
from edgeattn.runtime.generation.backend import preferred_chunk
from edgeattn.runtime.generation.decoder_bundle import open_decoder
from edgeattn.runtime.generation.engine import Event, Job, new_job
from edgeattn.runtime.generation.sampling import SamplingConfig
from edgeattn.runtime.live_window import LiveWindow
from edgeattn.runtime.server.metrics import ServerMetrics
from edgeattn.runtime.server.scheduler import SlotScheduler
from edgeattn.runtime.server.served_model import longest_sequence
from edgeattn.runtime.server.settings import DEFAULT_SLOTS, ServeSettings

DEFAULT_MAX_TOKENS_LIMIT = 4096  # when the model does not say how many positions it was trained for


def is_decoder(bundle: Bundle) -> bool:
    return bool(bundle.manifest.sections.get("decoder"))


def window_bound(bundle: Bundle) -> int:
    """The largest useful window: a decoder's ring, else the longest sequence the bundle accepts."""
    if is_decoder(bundle):
        return int(bundle.manifest.sections["decoder"]["window_max"])
    return longest_sequence(bundle)


@dataclass
class Stream:
    job: Job
    events: asyncio.Queue

    def cancel(self) -> None:
        self.job.cancel()


class DecoderRuntime:
    """Lifecycle as ModelRuntime's: `start` activates and warms up, then it is ready; `stop` drains it."""

    kind = "decoder"

    def __init__(self, bundle: Bundle, name: str, settings: ServeSettings, window: LiveWindow,
                 metrics: ServerMetrics, *, device: int | None = None) -> None:
        """`device`: the GPU index of one of a model's engines (decoder_group.py); None: the model's only engine."""
        self.name, self.bundle, self.settings = name, bundle, settings
        self.device = None if device is None else gpu_devices.device_label(device)
        ring = int(bundle.manifest.sections["decoder"]["window_max"])
        if settings.window_max > ring:
            raise ConfigError(f"window_max: expected at most {name!r}'s ring of {ring} rows, found "
                              f"{settings.window_max}")
        if device is None:
            self.model = open_decoder(bundle, window_max=settings.window_max or None, threads=settings.threads)
        else:
            self.model = gpu_devices.open_engine_decoder(bundle, device, window_max=settings.window_max or None)
        # cuda bundles: the slot pool sized from (or checked against) the GPU's memory left after the weights
        where = repr(name) + (f" on {self.device}" if self.device else "")
        self.plan = slot_plan(self.model, settings.slots or None, where) if is_cuda_bundle(bundle) else None
        self.slots = self.plan.slots if self.plan else settings.slots or DEFAULT_SLOTS
        self.live_window, self.metrics = window, metrics
        self.ready = False
        self.created = int(time.time())
        positions = int(self.model.info.get("max_positions") or 0)
        self.max_tokens_limit = positions or DEFAULT_MAX_TOKENS_LIMIT
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams: dict[Job, asyncio.Queue] = {}
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()  # the worker's events, for the courier thread
        self._courier: threading.Thread | None = None
        self.scheduler = SlotScheduler(self.model, slots=self.slots, max_queue=settings.max_queue,
                                       prefill_chunk=settings.prefill_chunk or preferred_chunk(self.model, 16),
                                       window=window.budget,
                                       deliver=self._deliver, metrics=metrics.generation, model_name=name,
                                       prefill_in_step=settings.prefill_in_step,
                                       prompt_attention=settings.prompt_attention)
        g = metrics.generation
        g.slots.labels(name).set(self.slots)
        cache_bytes = int(getattr(self.scheduler.cache, "nbytes", 0))
        g.cache_bytes.labels(name).set(cache_bytes)
        g.slot_bytes.labels(name).set(cache_bytes // self.slots)

    def describe(self) -> str:
        """One line for the start-up log: the slots, the bytes a slot's cache takes, and the memory."""
        where = self.name if self.device is None else f"{self.name} on {self.device}"
        if self.plan is not None:
            return f"{where}: {self.plan.describe()}; running in {self.model.info.get('precision')}"
        cache = int(getattr(self.scheduler.cache, "nbytes", 0))
        return f"{where}: {self.slots} slots x {cache / self.slots / 2**20:.1f} MiB of cache = {cache / 2**30:.2f} GiB"

    @property
    def free_slots(self) -> int:
        """Slots neither busy nor promised to a queued request (negative when requests queue)."""
        return self.slots - self.scheduler.busy - self.scheduler.depth

    @property
    def codec(self):
        return self.model.codec

    @property
    def layout(self):
        return self.model.layout

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            await self._loop.run_in_executor(None, self._activate)
        except EdgeAttnError as exc:
            raise RuntimeBackendError(f"model {self.name!r} failed to start: {exc}") from None
        except Exception as exc:
            raise RuntimeBackendError(f"model {self.name!r} failed to start: {type(exc).__name__}: {exc}") from None
        self._courier = threading.Thread(target=self._carry, name="edgeattn-courier", daemon=True)
        self._courier.start()
        self.scheduler.start()
        self.ready = True

    def _activate(self) -> None:
        import numpy as np

        self.model.activate()
        cache = self.scheduler.cache
        for rows in sorted({1, self.slots})[: 1 + (self.settings.warmup_runs > 0)]:
            self.model.step(cache, list(range(rows)), np.zeros((rows, 1), dtype=np.int64), 0)
        for slot in range(cache.streams):
            cache.reset(slot)

    def submit(self, prompt_ids: list[int], *, max_tokens: int, sampling: SamplingConfig,
               stops: tuple[str, ...], budget: int | None = None) -> Stream:
        """Queue a request (QueueFull when the queue is full). The prompt is cut to head + tail if it does
        not fit the cache with room for the answer (`job.evicted` says how many tokens were left out);
        `budget` (rows) caps the live attention budget for this request."""
        job = new_job(self.model.layout, prompt_ids, max_tokens=max_tokens, sampling=sampling, stops=stops,
                      budget=budget)
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[job] = queue
        try:
            self.scheduler.submit(job)
        except Exception:
            del self._streams[job]
            raise
        g = self.metrics.generation
        g.prompt_tokens.labels(self.name).inc(len(prompt_ids))
        if job.evicted:
            g.evicted.labels(self.name).inc(job.evicted)
        g.waiting.labels(self.name).set(self.scheduler.depth)
        return Stream(job, queue)

    def _deliver(self, events: list[tuple[Job, Event]]) -> None:
        """Worker thread: leave the iteration's events to the courier and go on to the model call at once.

        Waking the event loop from the worker (`call_soon_threadsafe` writes to a socket, which lets go of the
        GIL) hands the GIL to the loop, and the worker then waits while the loop routes and writes: 5-10 ms per
        iteration on a busy 2-core machine. The courier wakes the loop instead, while the worker is inside the
        model call, which runs without the GIL."""
        self._outbox.put((events, time.perf_counter()))

    def _carry(self) -> None:
        """Courier thread: each batch of events to the event loop, in order; None ends it."""
        while (item := self._outbox.get()) is not None:
            loop = self._loop
            if loop is not None and not loop.is_closed():
                try:
                    loop.call_soon_threadsafe(self._route, *item)
                except RuntimeError:  # the loop closed meanwhile
                    pass

    def _route(self, events: list[tuple[Job, Event]], sent: float) -> None:
        self.scheduler.profile.add("loop_lag", time.perf_counter() - sent)
        for job, event in events:
            queue = self._streams.get(job)
            if queue is None:
                continue
            queue.put_nowait(event)
            if event.finish_reason is not None:
                del self._streams[job]

    async def stop(self, timeout: float | None = None) -> None:
        """Stop admitting; the streams in flight finish within `timeout` s, then end with finish reason
        `abort` (a last chunk says so); release the model."""
        self.ready = False
        timeout = self.settings.shutdown_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while not self.scheduler.idle() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self.scheduler.end_all()
        while not self.scheduler.idle() and time.monotonic() < deadline + 5:
            await asyncio.sleep(0.01)
        self.scheduler.close()
        self._outbox.put(None)
        if self._courier is not None:
            await self._loop.run_in_executor(None, self._courier.join, 5.0)
        await asyncio.sleep(0)  # let the last events reach their streams
        self.model.deactivate()

    def abandon(self) -> None:
        self.ready = False
        self.scheduler.end_all()

    def metadata(self) -> dict:
        layout = self.model.layout
        return {"name": self.name, "versions": ["1"], "platform": "edgeattn_decoder",
                "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1]}],
                "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [1]}],
                "parameters": {"slots": self.slots, "sinks": layout.sinks, "window_max": layout.window_max,
                               "max_tokens_limit": self.max_tokens_limit,
                               **({"precision": self.model.info["precision"]} if self.plan else {})}}

    def statistics(self) -> dict:
        return {"name": self.name, "version": "1", "slots": self.slots, "busy": self.scheduler.busy,
                "waiting": self.scheduler.depth, "slot_moves": self.scheduler.moves,
                "profile": self.scheduler.profile.snapshot()}
