"""Continuous batching for a decoder bundle: the decode engine (edgeattn.runtime.generation.engine) with a
fixed number of slots, stepped by one worker thread, and a bounded queue in front of it.

The worker owns the model and the cache (ONNX Runtime releases the GIL while it runs; the event loop only
routes): while any job is queued or in a slot it calls `engine.step()`, otherwise it sleeps until `submit`
wakes it. A queued job takes a free slot at the next step (every free slot is filled at once), so a request is
refused (`QueueFull`) only when all the slots are taken or promised and `max_queue` more jobs wait. The engine
hands each step's events to `deliver(list of (job, Event))` just before the next model call (or before the
worker sleeps), so the event loop's routing, JSON and socket writes run while the model runs without the GIL
(the runtime's courier thread wakes the loop). `profile` (a StepProfile) times every phase of the steps
(docs/serving.md, "Where the time goes"). `window` gives the live budget (a window, or an `AttentionBudget`:
the server passes `LiveWindow.budget`), read once a step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from edgeattn.attention.budget import AttentionBudget
from edgeattn.runtime.generation.backend import DecoderBackend
from edgeattn.runtime.generation.engine import (FINISH_ABORT, FINISH_LENGTH, FINISH_STOP, Deliver, Engine, Event,
                                                Job)

__all__ = ["FINISH_ABORT", "FINISH_LENGTH", "FINISH_STOP", "Event", "Job", "QueueFull", "SlotScheduler"]


class QueueFull(Exception):
    """Every slot is busy and the queue holds `max_queue` jobs."""


class SlotScheduler:
    """`submit(job)` queues a job (QueueFull beyond the free slots and `max_queue` waiting); `start()` /
    `close(timeout)` run the worker."""

    def __init__(self, model: DecoderBackend, *, slots: int, max_queue: int, prefill_chunk: int,
                 window: Callable[[], int | AttentionBudget], deliver: Deliver, metrics=None, model_name: str = "",
                 prefill_in_step: int = 0, prompt_attention: str = "budget") -> None:
        self.engine = Engine(model, slots=slots, prefill_chunk=prefill_chunk, window=window, deliver=deliver,
                             metrics=metrics, model_name=model_name, prefill_in_step=prefill_in_step,
                             prompt_attention=prompt_attention)
        self.model, self.slots, self.max_queue = model, slots, max_queue
        self._running = False
        self._thread: threading.Thread | None = None

    # --- the event loop's side -------------------------------------------------------------------------
    @property
    def cache(self):
        return self.engine.cache

    @property
    def profile(self):
        return self.engine.profile

    @property
    def moves(self) -> int:
        return self.engine.moves

    @property
    def busy(self) -> int:
        return self.engine.busy

    @property
    def depth(self) -> int:
        return self.engine.depth

    def idle(self) -> bool:
        return self.engine.idle()

    def submit(self, job: Job) -> None:
        engine = self.engine
        with engine.lock:
            if not self._running:
                raise RuntimeError("the scheduler is not running")
            free = max(self.slots - engine.busy, 0)
            if len(engine.waiting) >= free + self.max_queue:
                raise QueueFull(f"{self.slots} slots taken and {self.max_queue} requests queued")
            engine.add(job)

    def start(self) -> None:
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="edgeattn-decode", daemon=True)
        self._thread.start()

    def end_all(self) -> None:
        """End every job at its next step (finish reason `abort`), waiting ones included."""
        self.engine.end_all()

    def close(self, join_s: float = 10.0) -> None:
        with self.engine.lock:
            self._running = False
            self.engine.lock.notify()
        if self._thread is not None:
            self._thread.join(join_s)

    # --- the worker --------------------------------------------------------------------------------------
    def _loop(self) -> None:
        engine, clock = self.engine, time.perf_counter
        while True:
            with engine.lock:
                idle = self._running and engine.idle()
            if idle:
                engine.flush()  # what the last step produced, before sleeping
            with engine.lock:
                if self._running and engine.idle():
                    before = clock()
                    while self._running and engine.idle():
                        engine.lock.wait()
                    engine.profile.add("wait", clock() - before)
                if not self._running:
                    engine.abort_all()
                    engine.flush()
                    return
            try:
                engine.step()
            except Exception as exc:  # a failure outside the model calls ends the jobs in flight, not the server
                engine.fail_all(exc)
