"""Continuous batching for a decoder bundle: a fixed number of slots, one KV-cache row each, one decode loop.

One worker thread owns the model and the cache (ONNX Runtime releases the GIL while it runs; the event loop
only routes). Every iteration it admits waiting jobs into free slots, runs at most one prefill chunk (so a long
prompt does not stall the others) and then one decode step over every decoding slot. Prompts of at most
`prefill_in_step` tokens skip the chunk: they ride along the decode steps, one prompt token per step, so
their prefill adds rows to the step the others run anyway instead of a call of its own (whether a job is
prefilled in chunks or in steps depends only on its own prompt's length, so its numbers do not depend on
the other jobs). Decoding jobs always occupy slots 0..K-1 (a finished job's slot is filled by moving the last
one into it), so the step feeds the cache rows as views, never a copy; the job being prefilled in chunks sits
in slot K. A slot's position is reset when a
job takes it: the attention op never reads rows beyond a stream's position, so no job sees another's keys.

The live window is read once per iteration and applies to every slot's next step (the sinks are always kept).
Events go back to the event loop in one call per iteration (`deliver(list of (job, Event))`), made just before
the next model call (or before the worker sleeps), so that the loop's routing, JSON and socket writes run while
the model runs without the GIL (the runtime's courier thread wakes the loop). `profile` (a StepProfile) times
every phase of the iterations (docs/serving.md, "Where the time goes").
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from edgeattn.runtime.generation.decoder_bundle import DecoderModel
from edgeattn.runtime.generation.sampling import Sampler
from edgeattn.runtime.generation.text import TextStream
from edgeattn.runtime.server.step_profile import StepProfile

FINISH_STOP, FINISH_LENGTH, FINISH_ABORT = "stop", "length", "abort"


class QueueFull(Exception):
    """Every slot is busy and the queue holds `max_queue` jobs."""


class StopMatcher:
    """Stop strings over streamed text: holds back the tail that could begin a stop string, so no chunk ever
    carries part of one; `feed` returns (text to emit, whether a stop string ended the text)."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops, self.held = stops, ""

    def feed(self, piece: str) -> tuple[str, bool]:
        if not self.stops:
            return piece, False
        text = self.held + piece
        hits = [i for i in (text.find(s) for s in self.stops) if i != -1]
        if hits:
            self.held = ""
            return text[:min(hits)], True
        keep = max((k for s in self.stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        self.held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep], False

    def flush(self) -> str:
        held, self.held = self.held, ""
        return held


@dataclass
class Event:
    """What one iteration produced for a job: text (maybe empty), new tokens, the window and the finish."""

    text: str
    tokens: int
    window: int
    finish_reason: str | None = None


@dataclass(eq=False)
class Job:
    prompt: list[int]  # the kept prompt (head + tail when the original was longer than the cache)
    prompt_tokens: int  # the original prompt's length
    evicted: int  # prompt tokens left out
    max_tokens: int
    sampler: Sampler
    stops: tuple[str, ...] = ()
    arrived: float = field(default_factory=time.perf_counter)
    slot: int | None = None
    prefilled: int = 0
    tokens: list[int] = field(default_factory=list)
    cancelled: bool = False
    finish_reason: str | None = None
    last_token_at: float = 0.0
    text: TextStream | None = None
    matcher: StopMatcher | None = None

    def cancel(self) -> None:
        """The client went away: the worker frees the slot before its next step (thread-safe: a flag)."""
        self.cancelled = True


Deliver = Callable[[list[tuple[Job, Event]]], None]


class SlotScheduler:
    """`submit(job)` queues a job (QueueFull beyond `max_queue` waiting); `start()` / `stop(timeout)` run the
    worker. `on_stats` gets (busy slots, waiting jobs, KV tokens held) after every iteration."""

    def __init__(self, model: DecoderModel, *, slots: int, max_queue: int, prefill_chunk: int,
                 window: Callable[[], int], deliver: Deliver, metrics=None, model_name: str = "",
                 prefill_in_step: int = 0) -> None:
        self.model, self.slots, self.max_queue = model, slots, max_queue
        self.prefill_chunk = min(prefill_chunk, model.layout.window_max)
        self.prefill_in_step = prefill_in_step
        self.window, self.deliver = window, deliver
        self.metrics, self.model_name = metrics, model_name
        self.cache = model.new_cache(slots)
        self.decoding: list[Job] = []  # job i is in slot i
        self.prefilling: Job | None = None  # in slot len(decoding)
        self.waiting: deque[Job] = deque()
        self._cv = threading.Condition()
        self._running = False
        self._ending = False  # shutdown: end every job now with FINISH_ABORT
        self._thread: threading.Thread | None = None
        self._events: list[tuple[Job, Event]] = []
        self.moves = 0  # slot moves (cache row copies) so far
        self.profile = StepProfile()

    # --- the event loop's side -------------------------------------------------------------------------
    @property
    def busy(self) -> int:
        return len(self.decoding) + (self.prefilling is not None)

    @property
    def depth(self) -> int:
        return len(self.waiting)

    def submit(self, job: Job) -> None:
        with self._cv:
            if not self._running:
                raise RuntimeError("the scheduler is not running")
            if len(self.waiting) >= self.max_queue:
                raise QueueFull(f"{self.slots} slots busy and {len(self.waiting)} requests queued")
            self.waiting.append(job)
            self._cv.notify()

    def start(self) -> None:
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="edgeattn-decode", daemon=True)
        self._thread.start()

    def end_all(self) -> None:
        """End every job at its next step (finish reason `abort`), waiting ones included."""
        with self._cv:
            self._ending = True
            self._cv.notify()

    def idle(self) -> bool:
        return not (self.decoding or self.prefilling or self.waiting)

    def close(self, join_s: float = 10.0) -> None:
        with self._cv:
            self._running = False
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(join_s)

    # --- the worker --------------------------------------------------------------------------------------
    def _loop(self) -> None:
        clock, profile = time.perf_counter, self.profile
        while True:
            with self._cv:
                idle = self._running and self.idle()
            if idle:
                self._flush()  # what the last iteration produced, before sleeping
            with self._cv:
                if self._running and self.idle():
                    before = clock()
                    while self._running and self.idle():
                        self._cv.wait()
                    profile.add("wait", clock() - before)
                if not self._running:
                    aborting = list(self.decoding) + ([self.prefilling] if self.prefilling else []) + list(self.waiting)
                    for job in aborting:
                        self._finish(job, FINISH_ABORT)
                    self.decoding, self.prefilling = [], None
                    self.waiting.clear()
                    self._flush()
                    return
                if self._ending:
                    for job in self.waiting:
                        self._finish(job, FINISH_ABORT)
                    self.waiting.clear()
                before = clock()
                self._admit()
                profile.add("admit", clock() - before)
            try:
                self._iteration()
            except Exception as exc:  # a backend failure ends the jobs in flight, not the server
                for job in list(self.decoding) + ([self.prefilling] if self.prefilling else []):
                    self._finish(job, f"error: {type(exc).__name__}: {exc}")
                self.decoding, self.prefilling = [], None

    def _admit(self) -> None:
        while self.waiting and self.busy < self.slots:
            job = self.waiting[0]
            in_step = len(job.prompt) <= self.prefill_in_step
            if not in_step and self.prefilling is not None:
                return  # one job at a time is prefilled in chunks
            self.waiting.popleft()
            job.text, job.matcher = TextStream(self.model.codec), StopMatcher(job.stops)
            if in_step:
                if self.prefilling is not None:  # keep the chunked one just above the decoding slots
                    self._move(self.prefilling, len(self.decoding) + 1)
                job.slot = len(self.decoding)
                self.cache.reset(job.slot)
                self.decoding.append(job)
            else:
                job.slot = len(self.decoding)
                self.cache.reset(job.slot)
                self.prefilling = job

    def _current_window(self) -> int:
        w = int(self.window())
        return w if w <= self.model.layout.window_max else 0  # a window beyond the ring is the whole ring

    def _iteration(self) -> None:
        clock, profile = time.perf_counter, self.profile
        start = clock()
        window = self._current_window()
        for job in list(self.decoding) + ([self.prefilling] if self.prefilling else []):
            if job.cancelled or self._ending:
                self._finish(job, FINISH_ABORT)
        self._compact()
        profile.add("compact", clock() - start)
        self._flush()  # the previous iteration's events: the event loop routes them while the model runs
        prefill_tokens, prefill_s, decode_s, rows = 0, 0.0, 0.0, len(self.decoding)
        if self.prefilling is not None:
            prefill_tokens, prefill_s = self._prefill_chunk(self.prefilling, window)
        if self.decoding:
            rows = len(self.decoding)
            decode_s = self._decode_step(window)
        before = clock()
        self._compact()
        if self.metrics is not None:
            self._report()
        profile.add("compact", clock() - before)
        profile.iteration(rows, prefill_tokens, clock() - start, decode_s, prefill_s)

    def _prefill_chunk(self, job: Job, window: int) -> tuple[int, float]:
        """One chunk of the job being prefilled: (its tokens, the model call's seconds)."""
        piece = job.prompt[job.prefilled:job.prefilled + self.prefill_chunk]
        before = time.perf_counter()
        logits = self.model.step(self.cache, [job.slot], np.asarray([piece], dtype=np.int64), window, last_only=True)
        seconds = time.perf_counter() - before
        self.profile.add("prefill_model", seconds)
        job.prefilled += len(piece)
        if job.prefilled == len(job.prompt):
            self.prefilling = None
            self.decoding.append(job)  # its slot is len(decoding) before the append
            self._accept(job, self._sample(job, logits[0, -1]), window)
        return len(piece), seconds

    def _sample(self, job: Job, logits: np.ndarray) -> int:
        before = time.perf_counter()
        token = job.sampler(logits)
        self.profile.add("sample", time.perf_counter() - before)
        return token

    def _decode_step(self, window: int) -> float:
        """One decode step over every decoding slot; returns the model call's seconds."""
        jobs = list(self.decoding)
        ids = np.asarray([[j.prompt[j.prefilled] if j.prefilled < len(j.prompt) else j.tokens[-1]] for j in jobs],
                         dtype=np.int64)
        before = time.perf_counter()
        logits = self.model.step(self.cache, list(range(len(jobs))), ids, window, last_only=True)
        seconds = time.perf_counter() - before
        self.profile.add("decode_model", seconds)
        if self.metrics is not None:
            self.metrics.step_seconds.labels(self.model_name).observe(seconds)
            self.metrics.step_rows.labels(self.model_name).observe(len(jobs))
            overflow = sum(1 for j in jobs if self.cache.positions[j.slot] > self.model.layout.capacity)
            if overflow:
                self.metrics.evicted.labels(self.model_name).inc(overflow)
        for row, job in enumerate(jobs):
            if job.prefilled < len(job.prompt):  # a prompt token of a job prefilled in steps
                job.prefilled += 1
                if job.prefilled < len(job.prompt):
                    continue
            self._accept(job, self._sample(job, logits[row, -1]), window)
        return seconds

    def _accept(self, job: Job, token: int, window: int) -> None:
        now = time.perf_counter()
        try:
            self._record_token(job, token, window, now)
        finally:
            self.profile.add("accept", time.perf_counter() - now)

    def _record_token(self, job: Job, token: int, window: int, now: float) -> None:
        """Metrics, end of text, detokenizing and stop strings for one sampled token; queues its event."""
        if self.metrics is not None:
            if job.tokens or job.last_token_at:
                self.metrics.itl.labels(self.model_name).observe(now - job.last_token_at)
            else:
                self.metrics.ttft.labels(self.model_name).observe(now - job.arrived)
        job.last_token_at = now
        if token in self.model.eos:
            self._finish(job, FINISH_STOP, window)
            return
        job.tokens.append(token)
        if self.metrics is not None:
            self.metrics.generation_tokens.labels(self.model_name).inc()
        text, stopped = job.matcher.feed(job.text.push(token))
        if stopped:
            self._finish(job, FINISH_STOP, window, text, tokens=1)
        elif len(job.tokens) >= job.max_tokens:
            self._finish(job, FINISH_LENGTH, window, text + job.matcher.feed(job.text.flush())[0]
                         + job.matcher.flush(), tokens=1)
        else:
            self._events.append((job, Event(text, 1, window)))

    def _finish(self, job: Job, reason: str, window: int | None = None, text: str = "", tokens: int = 0) -> None:
        if job.finish_reason is not None:
            return
        job.finish_reason = reason
        if window is None:
            window = self._current_window()
        self._events.append((job, Event(text, tokens, window, reason)))
        if self.metrics is not None:
            self.metrics.finished.labels(self.model_name, reason.split(":")[0]).inc()

    def _compact(self) -> None:
        """Drop finished jobs and move the last decoding jobs into the holes, so slots 0..K-1 stay dense."""
        if self.prefilling is not None and self.prefilling.finish_reason is not None:
            self.prefilling = None
        if all(j.finish_reason is None for j in self.decoding):
            self._place_prefill()
            return
        live = [j for j in self.decoding if j.finish_reason is None]
        holes = sorted(j.slot for j in self.decoding if j.finish_reason is not None and j.slot < len(live))
        movers = sorted((j for j in live if j.slot >= len(live)), key=lambda j: j.slot)
        for job, hole in zip(movers, holes):
            self._move(job, hole)
        self.decoding = sorted(live, key=lambda j: j.slot)
        self._place_prefill()

    def _place_prefill(self) -> None:
        if self.prefilling is not None and self.prefilling.slot != len(self.decoding):
            self._move(self.prefilling, len(self.decoding))

    def _move(self, job: Job, slot: int) -> None:
        """Copy a job's cache rows (the filled part only) into another slot."""
        c, src = self.cache, job.slot
        filled = min(int(c.positions[src]), c.layout.capacity)
        for buffers in (c.keys, c.values):
            for layer in buffers:
                layer[slot, :, :filled] = layer[src, :, :filled]
        c.positions[slot] = c.positions[src]
        c.positions[src] = 0
        job.slot = slot
        self.moves += 1

    def _report(self) -> None:
        m, name = self.metrics, self.model_name
        m.running.labels(name).set(self.busy)
        m.waiting.labels(name).set(len(self.waiting))
        jobs = list(self.decoding) + ([self.prefilling] if self.prefilling else [])
        m.kv_tokens.labels(name).set(sum(self.cache.held(j.slot) for j in jobs))

    def _flush(self) -> None:
        if self._events:
            before = time.perf_counter()
            events, self._events = self._events, []
            self.deliver(events)
            self.profile.add("deliver", time.perf_counter() - before)
