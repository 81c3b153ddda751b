"""The decode engine: requests in slots of one KV cache, advanced by one step at a time. It is the only decode
loop: `Generator` (the Python API, `edgeattn generate`, the Triton model) drives a one-slot engine, the server's
`SlotScheduler` drives a many-slot one from a worker thread. The rules of a request live here once: the prompt
kept when it is longer than the cache (`fit_prompt`), prefill chunks (`chunk_size`), sampling, end of text,
stop strings (stops.py), the length limit and the live window.

Every `step()`:
1. ends cancelled jobs, drops finished ones and keeps the decoding jobs in slots 0..K-1 (a finished job's slot
   is filled by moving the last one into it), so a decode step feeds the cache rows as views, never a copy;
2. admits waiting jobs into every free slot at once. A job whose prompt has at most `prefill_in_step` tokens
   joins the decoding jobs and rides along their steps, one prompt token a step (its prefill adds rows to the
   step the others run anyway); any other job is prefilled in chunks, in a free slot above the decoding ones;
3. prefills the next chunk of every prefilling job, first admitted first, while their tokens fit the step's
   budget (`prefill_tokens`; the first job's chunk always runs, so a long prompt never stalls the others by
   more than a chunk): in one model call per attention budget when the backend prefills in batches
   (`PrefillBackend`), else one `step` call a chunk; a finished prefill joins the decoding jobs and samples its
   first token;
4. drops the jobs that ended at their first token, then runs one decode step over every decoding slot.
Whether a job is prefilled in chunks or in steps, and its chunks' lengths, depend only on its own prompt's
length and the window, never on the other jobs (the budget decides only in which step a chunk runs), so its
tokens do not depend on the other jobs. A slot's position is reset when a job takes it: the attention op never
reads rows beyond a stream's position, so no job sees another's keys.

The prefill budget defaults to the backend's `prefill_tokens` (16,384 on CUDA, where one pass over many streams
costs about what one stream's does) and, for a backend without batched prefill, to one chunk a step (on a CPU
a batch of chunks costs the sum of its chunks, so more a step would only delay the decoding jobs' next token).

A chunk holding sink positions ends by sinks + W: the op scores a chunk's own keys with q at true distances and
the sink rows with q rotated at min(t, sinks + W), so a first chunk reaching past sinks + W would read the sinks
farther away than token-by-token decoding does (docs/windowed-attention.md).

The live budget is read once a step: a window (an int) or an `AttentionBudget` (window W + k retrieval pages,
edgeattn/attention/budget.py); a window is the case k = 0, and a window beyond the ring is the whole ring (the
sinks are always kept). A job's own `budget` (rows, from its request) caps it for that job: the smaller of the
two, split as the live one is. Jobs may then run with different (W, k) in one step: the decode step calls the
model once per distinct (W, k), each call on the rows of that budget (the op takes one W and k per call), so a
stream's tokens never depend on the others' budgets; the cost is one more model call a step for each budget
beyond the first. Every event says the window and the budget (rows) its job ran with.
`prompt_attention` says what prompt chunks read: "budget" (the default), the same as generated tokens; "whole",
the whole cache (window 0, no pages), so the budget bounds generated tokens only (Quest's setting: a prompt is
read once, while every generated token pays for its budget). A prompt short enough to ride along the decode
steps (`prefill_in_step`) is read as generated tokens are.

Events go to `deliver(list of (job, Event))` in one call a step, made just before the
next model call, so a server's event loop routes them while the model runs without the GIL. A model failure
ends the jobs of that call (a prefill chunk: its job; a decode step: the jobs of that budget) with finish reason
`error: ...` and the exception in `job.error`; the other jobs go on. A failed prefill call over several jobs
runs again one job at a time (their positions put back first: a kept prompt never wraps the ring, so a failed
call overwrote no row a stream reads), so a failure that belongs to one prompt ends only its job. `profile` (a
StepProfile) times every phase.
The backend is any `DecoderBackend` (backend.py); one that samples on its device is used through `step_sample`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from edgeattn.attention.budget import DEFAULT_PAGE, AttentionBudget, check_page
from edgeattn.attention.ring import RingLayout
from edgeattn.errors import ConfigError, InputError
from edgeattn.runtime.generation.backend import (DecoderBackend, PrefillBackend, SamplingBackend,
                                                 SamplingPrefillBackend)
from edgeattn.runtime.generation.sampling import Sampler, SamplingConfig
from edgeattn.runtime.generation.step_profile import StepProfile
from edgeattn.runtime.generation.stops import StopMatcher
from edgeattn.runtime.generation.text import TextStream

FINISH_STOP, FINISH_LENGTH, FINISH_ABORT = "stop", "length", "abort"


def fit_prompt(ids: list[int], capacity: int, sinks: int, pin: int, reserve: int) -> tuple[list[int], int]:
    """Keep the head (max(sinks, pin) tokens) and the tail so the kept prompt plus `reserve` fits the cache."""
    budget = capacity - reserve
    if len(ids) <= budget:
        return ids, 0
    head = min(max(sinks, pin), budget // 2)
    tail = budget - head
    return ids[:head] + ids[len(ids) - tail:], len(ids) - head - tail


def chunk_size(layout: RingLayout, position: int, chunk: int, window: int) -> int:
    """Tokens of the next prefill chunk of a stream at `position`: at most `chunk` and the ring, and a chunk
    holding sink positions ends by sinks + W."""
    chunk = min(chunk, layout.window_max)
    if position >= layout.sinks:
        return chunk
    return min(chunk, layout.sinks + layout.live_window(window) - position)


@dataclass
class Event:
    """What one step produced for a job: text (maybe empty), new tokens (0 or 1, `token` the id), the window
    and the finish reason on the last one, and the budget in rows (sinks + W + k * page) the job ran with."""

    text: str
    tokens: int
    window: int
    finish_reason: str | None = None
    token: int | None = None
    budget: int = 0


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
    admitted_at: float = 0.0
    decoding_at: float = 0.0  # prefill done
    finished_at: float = 0.0
    error: BaseException | None = None  # the model failure that ended it
    budget: int | None = None  # the request's cap on the live budget, in rows (None: the live budget)
    ran_with: AttentionBudget | None = None  # the budget of its last model call

    def cancel(self) -> None:
        """The client went away: the engine frees the slot before its next step (thread-safe: a flag)."""
        self.cancelled = True


def new_job(layout: RingLayout, ids: list[int], *, max_tokens: int, sampling: SamplingConfig,
            stops: tuple[str, ...] = (), pin: int = 0, budget: int | None = None) -> Job:
    """A job for a prompt's token ids; a prompt longer than the cache (with room for the answer) keeps its head
    (the sinks, or `pin` tokens) and its tail, and `job.evicted` says how many tokens were left out. `budget`
    (rows) caps the live attention budget for this job (`check_request_budget`)."""
    if not ids:
        raise InputError("prompt: expected at least one token, found an empty prompt")
    budget = None if budget is None else check_request_budget(layout, budget)
    kept, evicted = fit_prompt(list(ids), layout.capacity, layout.sinks, pin,
                               reserve=min(max_tokens, layout.window_max // 2))
    return Job(kept, len(ids), evicted, max_tokens, Sampler(sampling), stops, budget=budget)


def check_request_budget(layout: RingLayout, budget) -> int:
    """A request's attention budget in rows, as an int: sinks + one page to the cache's rows, else ConfigError."""
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)):
        raise ConfigError(f"attention_budget: expected an integer number of rows, found "
                          f"{type(budget).__name__} {str(budget)[:40]!r}")
    lowest = layout.sinks + min(DEFAULT_PAGE, layout.window_max)
    if not lowest <= int(budget) <= layout.capacity:
        raise ConfigError(f"attention_budget: expected {lowest} (sinks + one page) to {layout.capacity} (the "
                          f"cache's rows), found {str(budget)[:40]}")
    return int(budget)


def budget_rows(layout: RingLayout, budget: AttentionBudget) -> int:
    """Rows a budget reads at most on this ring: sinks + W + k * page (a window of 0 is the whole ring)."""
    return layout.sinks + layout.live_window(budget.window) + budget.pages * budget.page


_PAGES_SUPPORT: dict[type, bool] = {}


def reads_pages(model) -> bool:
    """Whether a backend's step takes `pages` (retrieval pages beyond the window)."""
    kind = type(model)
    if kind not in _PAGES_SUPPORT:
        import inspect

        _PAGES_SUPPORT[kind] = "pages" in inspect.signature(model.step).parameters
    return _PAGES_SUPPORT[kind]


def budget_page(model) -> int:
    """Rows per retrieval page of a budget built for this model: its key bounds' page (a bundle exported with a
    page size), else the default (a model that reads the window only: its budgets have no pages to size)."""
    return int(getattr(model, "page", 0) or DEFAULT_PAGE)


def live_budget(model: DecoderBackend, value) -> AttentionBudget:
    """The budget a step runs with on this model's ring, from a window (int) or an AttentionBudget: a window
    beyond the ring is the whole ring (and then no pages), pages beyond the ring are dropped; a budget with
    pages goes through the backend's `check_budget` where it has one (a bundle without key bounds refuses)."""
    layout = model.layout
    window, pages, page = (value.window, value.pages, value.page) if isinstance(value, AttentionBudget) \
        else (value, 0, DEFAULT_PAGE)
    window = int(window)
    window = model.check_window(window if window <= layout.window_max else 0)
    pages = 0 if window == 0 else int(pages)
    if pages:
        page = check_page(layout, page)
        pages = min(pages, (layout.window_max - window) // page)
    if pages and not reads_pages(model):
        raise ConfigError(f"attention budget: expected a backend that reads retrieval pages, found "
                          f"{type(model).__name__}, which reads the window only: give a window (a budget with "
                          f"recent = 1.0)")
    budget = AttentionBudget(window, pages, page, layout.sinks)
    check = getattr(model, "check_budget", None) if pages else None
    return budget if check is None else check(budget)


PROMPT_ATTENTION = ("budget", "whole")


def check_prompt_attention(value) -> str:
    """What prompt chunks read: "budget" (as generated tokens) or "whole" (the whole cache), else ConfigError."""
    if value not in PROMPT_ATTENTION:
        raise ConfigError(f"prompt_attention: expected one of {', '.join(PROMPT_ATTENTION)}, found {value!r}")
    return value


def capped_budget(layout: RingLayout, live: AttentionBudget, rows: int | None) -> AttentionBudget:
    """The live budget capped at `rows` (a request's budget): the smaller of the two, split as the live one is
    (a window stays a window)."""
    if rows is None or rows >= budget_rows(layout, live):
        return live
    if not live.pages:
        return AttentionBudget(rows - layout.sinks, 0, live.page, layout.sinks)
    recent = live.window / (live.window + live.pages * live.page)
    return AttentionBudget.from_total(layout, rows, page=live.page, recent=recent)


Deliver = Callable[[list[tuple[Job, Event]]], None]


class Engine:
    """`add(job)` queues a job (thread-safe, under `lock`); `step()` advances every job by one iteration.
    `prefill_tokens`: prompt tokens prefilled a step (None: the backend's `prefill_tokens`, or one chunk a step
    for a backend without batched prefill; 0: one chunk a step)."""

    def __init__(self, model: DecoderBackend, *, slots: int, prefill_chunk: int,
                 window: Callable[[], int | AttentionBudget], deliver: Deliver, metrics=None, model_name: str = "",
                 prefill_in_step: int = 0, prefill_tokens: int | None = None,
                 prompt_attention: str = "budget") -> None:
        self.model, self.slots = model, slots
        self.prompt_attention = check_prompt_attention(prompt_attention)
        self.prefill_chunk, self.prefill_in_step = prefill_chunk, prefill_in_step
        self._batched_prefill = isinstance(model, PrefillBackend)
        self._sampled_prefill = isinstance(model, SamplingPrefillBackend)
        if prefill_tokens is None:
            prefill_tokens = int(model.prefill_tokens) if self._batched_prefill else 0
        if prefill_tokens < 0:
            raise ConfigError(f"prefill_tokens: expected >= 0 (0: one chunk a step), found {prefill_tokens}")
        self.prefill_tokens = prefill_tokens
        self.window, self.deliver = window, deliver
        self.metrics, self.model_name = metrics, model_name  # GenerationMetrics (runtime.server.metrics) or None
        self.cache = model.new_cache(slots)
        self.decoding: list[Job] = []  # job i is in slot i
        self.prefilling: list[Job] = []  # in free slots above the decoding ones, prefilled first come first
        self.waiting: deque[Job] = deque()
        self.lock = threading.Condition()  # guards `waiting`, `ending` and admission
        self.ending = False  # shutdown: end every job at the next step with FINISH_ABORT
        self.moves = 0  # slot moves (cache row copies) so far
        self.profile = StepProfile()
        self._events: list[tuple[Job, Event]] = []
        self._device_sampling = isinstance(model, SamplingBackend)
        if metrics is not None:  # the live budget, read at each scrape
            metrics.budget_rows.labels(model_name).set_function(lambda: self._live_or_nan("rows"))
            metrics.budget_pages.labels(model_name).set_function(lambda: self._live_or_nan("pages"))

    # --- state, safe to read from other threads ------------------------------------------------------------
    @property
    def busy(self) -> int:
        return len(self.decoding) + len(self.prefilling)

    @property
    def depth(self) -> int:
        return len(self.waiting)

    def idle(self) -> bool:
        return not (self.decoding or self.prefilling or self.waiting)

    def add(self, job: Job) -> None:
        with self.lock:
            self.waiting.append(job)
            self.lock.notify()

    def end_all(self) -> None:
        """End every job at the next step (finish reason `abort`), waiting ones included."""
        with self.lock:
            self.ending = True
            self.lock.notify()

    # --- one iteration ---------------------------------------------------------------------------------------
    def step(self) -> None:
        clock, profile = time.perf_counter, self.profile
        start = clock()
        live = self.live()
        window = live.window
        with self.lock:
            ending = self.ending
            if ending:
                while self.waiting:
                    self._finish(self.waiting.popleft(), FINISH_ABORT, window)
        for job in self.decoding + self.prefilling:
            if job.cancelled or ending:
                self._finish(job, FINISH_ABORT, window)
        self._compact()
        before = clock()
        with self.lock:
            self._admit(window)
        profile.add("admit", clock() - before)
        self.flush()  # the previous step's events: the event loop routes them while the model runs
        prefill_tokens, prefill_s, decode_s, rows = 0, 0.0, 0.0, 0
        if self.prefilling:
            prefill_tokens, prefill_s = self._prefill_chunks(live)
            self._compact()  # a job that ended at its first token leaves before the decode step
        if self.decoding:
            rows = len(self.decoding)
            decode_s = self._decode_step(live)
        before = clock()
        self._compact()
        self.report()
        profile.add("compact", clock() - before)
        profile.iteration(rows, prefill_tokens, clock() - start, decode_s, prefill_s)

    def live(self) -> AttentionBudget:
        """The live budget on this model's ring (`live_budget`)."""
        return live_budget(self.model, self.window())

    def _live_or_nan(self, what: str) -> float:
        """The live budget's rows or pages for a metrics scrape (NaN when it is not one this model can run:
        the next step reports why)."""
        try:
            live = self.live()
        except Exception:  # a scrape must not fail
            return float("nan")
        return float(budget_rows(self.model.layout, live) if what == "rows" else live.pages)

    def _budget(self, job: Job, live: AttentionBudget) -> AttentionBudget:
        return capped_budget(self.model.layout, live, job.budget)

    def _prompt_budget(self, job: Job, live: AttentionBudget) -> AttentionBudget:
        """What a prompt chunk reads: the job's budget, or the whole cache (prompt_attention "whole")."""
        if self.prompt_attention == "whole":
            return AttentionBudget(0, 0, live.page, self.model.layout.sinks)
        return self._budget(job, live)

    def _admit(self, window: int) -> None:
        """Every waiting job that a free slot can take, now (called under `lock`)."""
        codec, now = self.model.codec, time.perf_counter()
        while self.waiting and self.busy < self.slots:
            job = self.waiting.popleft()
            if job.cancelled:
                self._finish(job, FINISH_ABORT, window)
                continue
            job.text, job.matcher, job.admitted_at = TextStream(codec), StopMatcher(job.stops), now
            if len(job.prompt) <= self.prefill_in_step:
                target = len(self.decoding)
                occupant = self._prefilling_at(target)
                if occupant is not None:  # keep the decoding slots dense: the chunked job moves up
                    self._move(occupant, self._free_slot(besides=target))
                job.slot = target
                self.cache.reset(job.slot)
                self.decoding.append(job)
            else:
                job.slot = self._free_slot()
                self.cache.reset(job.slot)
                self.prefilling.append(job)

    def _free_slot(self, besides: int = -1) -> int:
        used = {j.slot for j in self.decoding + self.prefilling} | {besides}
        return next(s for s in range(self.slots) if s not in used)

    def _prefilling_at(self, slot: int) -> Job | None:
        return next((j for j in self.prefilling if j.slot == slot), None)

    def _next_chunks(self, live: AttentionBudget) -> list[tuple[Job, list[int], AttentionBudget]]:
        """The next chunk of every prefilling job (with its budget), first admitted first, while their tokens fit
        the step's budget (the first always runs). A chunk's length depends only on its own job."""
        batch, total = [], 0
        for job in self.prefilling:
            budget = self._prompt_budget(job, live)
            size = chunk_size(self.model.layout, int(self.cache.positions[job.slot]), self.prefill_chunk,
                              budget.window)
            piece = job.prompt[job.prefilled:job.prefilled + size]
            if batch and total + len(piece) > self.prefill_tokens:
                break
            batch.append((job, piece, budget))
            total += len(piece)
        return batch

    def _prefill_chunks(self, live: AttentionBudget) -> tuple[int, float]:
        """This step's prefill: one call per budget (per chunk for a backend without batched prefill); returns
        (its tokens, the calls' seconds)."""
        batch = self._next_chunks(live)
        groups: dict = {}
        for n, item in enumerate(batch):
            groups.setdefault(item[2] if self._batched_prefill else n, []).append(item)
        seconds = sum(self._prefill_group(group, live.window) for group in groups.values())
        return sum(len(piece) for _, piece, _ in batch), seconds

    def _prefill_group(self, group: list, window: int) -> float:
        """One model call for chunks of some jobs of one budget; a failed call over several jobs runs again job by
        job, so a failure ends only the job it belongs to. Returns the calls' seconds."""
        streams = [job.slot for job, _, _ in group]
        positions = self.cache.positions[streams].copy()
        try:
            tokens, seconds = self._prefill_call(group)
        except Exception as exc:
            self.cache.positions[streams] = positions  # the failed call advanced no stream
            if len(group) == 1:
                self._fail([group[0][0]], exc, window)
                return 0.0
            return sum(self._prefill_group([item], window) for item in group)
        for (job, piece, _), token in zip(group, tokens):
            job.prefilled += len(piece)
            if job.prefilled == len(job.prompt):
                self._join(job)
                self._accept(job, token, window)
        return seconds

    def _prefill_call(self, group: list) -> tuple[list[int | None], float]:
        """The model call for chunks of some jobs of one budget: the first token of each job whose prompt ends
        here (None for the others), and the call's seconds."""
        wanted = [job if job.prefilled + len(piece) == len(job.prompt) else None for job, piece, _ in group]
        streams, budget = [job.slot for job, _, _ in group], group[0][2]
        for job, _, _ in group:
            job.ran_with = budget
        if not self._batched_prefill:
            return self._call(streams, [group[0][1]], budget, wanted, "prefill_model")
        chunks = [np.asarray(piece, dtype=np.int64) for _, piece, _ in group]
        window, pages = budget.window, ({"pages": budget.pages} if budget.pages else {})
        before = time.perf_counter()
        if self._sampled_prefill and any(wanted):
            default = SamplingConfig()
            chosen = self.model.prefill_sample(self.cache, streams, chunks, window,
                                               [j.sampler.config if j else default for j in wanted], **pages)
            tokens = [int(t) if j else None for t, j in zip(chosen, wanted)]
            seconds = time.perf_counter() - before
        else:
            logits = self.model.prefill(self.cache, streams, chunks, window, **pages)
            seconds = time.perf_counter() - before
            tokens = [self._sample(j, logits[row]) if j else None for row, j in enumerate(wanted)]
        self.profile.add("prefill_model", seconds)
        return tokens, seconds

    def _join(self, job: Job) -> None:
        """A prefilled job takes slot K, next to the K decoding ones (a job prefilling there swaps with it)."""
        target = len(self.decoding)
        if job.slot != target:
            occupant = self._prefilling_at(target)
            if occupant is not None:
                self.cache.swap(job.slot, target)
                occupant.slot, job.slot = job.slot, target
                self.moves += 1
            else:
                self._move(job, target)
        self.decoding.append(job)
        self.prefilling.remove(job)
        job.decoding_at = time.perf_counter()

    def _decode_step(self, live: AttentionBudget) -> float:
        """One decode step over every decoding slot, one model call per distinct budget; returns the calls'
        seconds. A failed call ends the jobs of its rows; the others go on."""
        window = live.window
        everyone = list(self.decoding)
        ids = [[j.prompt[j.prefilled] if j.prefilled < len(j.prompt) else j.tokens[-1]] for j in everyone]
        wanted = [None if j.prefilled + 1 < len(j.prompt) else j for j in everyone]  # rows whose next token is due
        groups: dict[AttentionBudget, list[int]] = {}
        for row, job in enumerate(everyone):
            groups.setdefault(self._budget(job, live), []).append(row)
        by_row: dict[int, int | None] = {}
        seconds = 0.0
        for budget, rows in groups.items():
            for r in rows:
                everyone[r].ran_with = budget
            try:
                got, spent = self._call(rows, [ids[r] for r in rows], budget, [wanted[r] for r in rows],
                                        "decode_model")
            except Exception as exc:
                self._fail([everyone[r] for r in rows], exc, window)
                continue
            seconds += spent
            by_row.update(zip(rows, got))
        if not by_row:
            return 0.0
        jobs, tokens = [everyone[r] for r in sorted(by_row)], [by_row[r] for r in sorted(by_row)]
        if self.metrics is not None:
            self.metrics.step_seconds.labels(self.model_name).observe(seconds)
            self.metrics.step_rows.labels(self.model_name).observe(len(jobs))
            overflow = sum(1 for j in jobs if self.cache.positions[j.slot] > self.model.layout.capacity)
            if overflow:
                self.metrics.evicted.labels(self.model_name).inc(overflow)
        for job, token in zip(jobs, tokens):
            if job.prefilled < len(job.prompt):  # a prompt token of a job prefilled in steps
                job.prefilled += 1
                if job.prefilled == len(job.prompt):
                    job.decoding_at = time.perf_counter()
            if token is not None:
                self._accept(job, token, window)
        return seconds

    def _call(self, streams: list[int], ids: list[list[int]], budget: AttentionBudget, wanted: list[Job | None],
              phase: str) -> tuple[list[int | None], float]:
        """One model call with one budget; the next token of each row whose job is given (None for the others),
        and the call's seconds. `pages` reaches the backend only when there are some (a window-only backend
        takes no `pages`)."""
        batch = np.asarray(ids, dtype=np.int64)
        window, pages = budget.window, ({"pages": budget.pages} if budget.pages else {})
        before = time.perf_counter()
        if self._device_sampling and any(wanted):
            default = SamplingConfig()
            chosen = self.model.step_sample(self.cache, streams, batch, window,
                                            [j.sampler.config if j else default for j in wanted], **pages)
            seconds = time.perf_counter() - before
            self.profile.add(phase, seconds)
            return [int(t) if j else None for t, j in zip(chosen, wanted)], seconds
        logits = self.model.step(self.cache, streams, batch, window, last_only=True, **pages)
        seconds = time.perf_counter() - before
        self.profile.add(phase, seconds)
        return [self._sample(j, logits[row, -1]) if j else None for row, j in enumerate(wanted)], seconds

    def _sample(self, job: Job, logits: np.ndarray) -> int:
        before = time.perf_counter()
        token = job.sampler(logits)
        self.profile.add("sample", time.perf_counter() - before)
        return token

    def _accept(self, job: Job, token: int, window: int) -> None:
        now = time.perf_counter()
        try:
            self._record_token(job, token, window, now)
        finally:
            self.profile.add("accept", time.perf_counter() - now)

    def _record_token(self, job: Job, token: int, window: int, now: float) -> None:
        """Metrics, end of text, detokenizing, stop strings and the length limit for one chosen token."""
        if self.metrics is not None:
            if job.tokens or job.last_token_at:
                self.metrics.itl.labels(self.model_name).observe(now - job.last_token_at)
            else:
                self.metrics.ttft.labels(self.model_name).observe(now - job.arrived)
        job.last_token_at = now
        if token in self.model.eos:
            text, _ = self._final_text(job)
            self._finish(job, FINISH_STOP, window, text)
            return
        job.tokens.append(token)
        if self.metrics is not None:
            self.metrics.generation_tokens.labels(self.model_name).inc()
        text, stopped = job.matcher.feed(job.text.push(token))
        if not stopped and len(job.tokens) >= job.max_tokens:
            tail, stopped = self._final_text(job)
            self._finish(job, FINISH_STOP if stopped else FINISH_LENGTH, window, text + tail, token)
        elif stopped:
            self._finish(job, FINISH_STOP, window, text, token)
        else:
            self._events.append((job, self._event(job, text, 1, window, None, token)))

    @staticmethod
    def _final_text(job: Job) -> tuple[str, bool]:
        """The text held back at the end (an unfinished character, the start of a stop string that never
        came); True when it completes a stop string."""
        text, stopped = job.matcher.feed(job.text.flush())
        return (text, True) if stopped else (text + job.matcher.flush(), False)

    def _finish(self, job: Job, reason: str, window: int, text: str = "", token: int | None = None) -> None:
        if job.finish_reason is not None:
            return
        job.finish_reason, job.finished_at = reason, time.perf_counter()
        self._events.append((job, self._event(job, text, int(token is not None), window, reason, token)))
        if self.metrics is not None:
            self.metrics.finished.labels(self.model_name, reason.split(":")[0]).inc()

    def _event(self, job: Job, text: str, tokens: int, window: int, reason: str | None, token: int | None) -> Event:
        """An event with the window and budget the job last ran with (the live window before its first call)."""
        budget = job.ran_with
        if budget is None:
            return Event(text, tokens, window, reason, token)
        return Event(text, tokens, budget.window, reason, token, budget_rows(self.model.layout, budget))

    def _fail(self, jobs: list[Job], exc: BaseException, window: int) -> None:
        for job in jobs:
            job.error = exc
            self._finish(job, f"error: {type(exc).__name__}: {exc}", window)

    def fail_all(self, exc: BaseException) -> None:
        """End every job in a slot with the error (a failure outside the model calls)."""
        self._fail(self.decoding + self.prefilling, exc, 0)
        self._compact()
        self.report()

    def abort_all(self) -> None:
        """End every job now, waiting ones included (shutdown)."""
        with self.lock:
            jobs = self.decoding + self.prefilling + list(self.waiting)
            self.waiting.clear()
        for job in jobs:
            self._finish(job, FINISH_ABORT, 0)
        self._compact()
        self.report()

    # --- slots ----------------------------------------------------------------------------------------------
    def _compact(self) -> None:
        """Drop finished jobs and move the last decoding jobs into the holes, so slots 0..K-1 stay dense."""
        if any(j.finish_reason is not None for j in self.prefilling):
            self.prefilling = [j for j in self.prefilling if j.finish_reason is None]
        if all(j.finish_reason is None for j in self.decoding):
            return
        live = [j for j in self.decoding if j.finish_reason is None]
        holes = sorted(j.slot for j in self.decoding if j.finish_reason is not None and j.slot < len(live))
        movers = sorted((j for j in live if j.slot >= len(live)), key=lambda j: j.slot)
        for job, hole in zip(movers, holes):
            self._move(job, hole)
        self.decoding = sorted(live, key=lambda j: j.slot)

    def _move(self, job: Job, slot: int) -> None:
        self.cache.move(job.slot, slot)
        job.slot = slot
        self.moves += 1

    # --- output -----------------------------------------------------------------------------------------------
    def report(self) -> None:
        """The gauges: slots busy, jobs waiting, KV tokens held."""
        if self.metrics is None:
            return
        m, name = self.metrics, self.model_name
        m.running.labels(name).set(self.busy)
        m.waiting.labels(name).set(len(self.waiting))
        m.kv_tokens.labels(name).set(sum(self.cache.held(j.slot) for j in self.decoding + self.prefilling))

    def flush(self) -> None:
        if self._events:
            before = time.perf_counter()
            events, self._events = self._events, []
            self.deliver(events)
            self.profile.add("deliver", time.perf_counter() - before)
