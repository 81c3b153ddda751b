"""A served model at run time: backend lifecycle, warm-up, window feeding, batcher and Triton-style statistics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from edgeattn.bundle.folder import Bundle
from edgeattn.errors import EdgeAttnError, RuntimeBackendError
from edgeattn.runtime.live_window import LiveWindow
from edgeattn.runtime.server.batcher import DynamicBatcher, Outcome
from edgeattn.runtime.server.metrics import ServerMetrics
from edgeattn.runtime.server.served_model import VERSION, ServedModel
from edgeattn.runtime.server.settings import ServeSettings
from edgeattn.sample_inputs import make_inputs


@dataclass
class _Stat:
    count: int = 0
    ns: int = 0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.ns += int(seconds * 1e9)

    def as_dict(self) -> dict:
        return {"count": self.count, "ns": self.ns}


@dataclass
class ModelStats:
    success: _Stat = field(default_factory=_Stat)
    fail: _Stat = field(default_factory=_Stat)
    queue: _Stat = field(default_factory=_Stat)
    compute_infer: _Stat = field(default_factory=_Stat)
    inference_count: int = 0  # rows
    execution_count: int = 0  # backend runs
    batches: dict[int, _Stat] = field(default_factory=dict)
    last_inference_ms: int = 0

    def batch(self, rows: int, seconds: float) -> None:
        self.execution_count += 1
        self.inference_count += rows
        self.batches.setdefault(rows, _Stat()).add(seconds)


class ModelRuntime:
    """Owns one bundle's backend. `start` activates and warms it up, then it is ready; `stop` drains it."""

    def __init__(self, bundle: Bundle, name: str, settings: ServeSettings, window: LiveWindow,
                 metrics: ServerMetrics) -> None:
        from edgeattn.runtime.backends import open_backend

        self.served = ServedModel(name, bundle)
        self.settings = settings
        self.live_window = window
        self.metrics = metrics
        self.stats = ModelStats()
        self.ready = False
        options = {"threads": settings.threads} if bundle.manifest.backend == "onnxruntime" else {}
        self.backend = open_backend(bundle, **options)
        self.max_batch = min(settings.max_batch, self.served.max_batch) if self.served.batchable else 1
        self.batcher = DynamicBatcher(name, self.run, max_batch=self.max_batch,
                                      max_delay_s=settings.max_queue_delay_ms / 1000.0,
                                      max_queue=settings.max_queue, on_batch=self._on_batch)

    @property
    def name(self) -> str:
        return self.served.name

    def run(self, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int | None]:
        """Worker thread: add the live window (read once per batch) and run the backend."""
        spec = self.served.window_input
        if spec is None:
            return self.backend.infer(feeds), None
        window = self.live_window.get()
        shape = tuple(d if isinstance(d, int) else 1 for d in spec.dims)
        return self.backend.infer({**feeds, spec.name: np.full(shape, window, dtype=spec.dtype)}), window

    def _on_batch(self, rows: int, seconds: float) -> None:
        self.stats.batch(rows, seconds)
        self.metrics.batch_size.labels(self.name).observe(rows)
        self.metrics.compute_time.labels(self.name).observe(seconds)

    def _warmup(self) -> None:
        m = self.served.bundle.manifest
        kinds = m.sections.get("dimension_kinds", {})
        for rows in sorted({1, self.max_batch}):
            sizes = {d: (rows if kinds.get(d) == "batch" else r[1]) for d, r in m.shape_ranges.items()}
            feeds = make_inputs(self.served.inputs, sizes)
            for _ in range(self.settings.warmup_runs):
                self.run(feeds)

    async def start(self) -> None:
        """Activate and warm up; a failure is a RuntimeBackendError that names the model and the reason."""
        self.batcher.start()
        try:
            await self.batcher.run_direct(self.backend.activate)
            await self.batcher.run_direct(self._warmup)
        except EdgeAttnError as exc:
            raise RuntimeBackendError(f"model {self.name!r} failed to start: {exc}") from None
        except Exception as exc:  # a backend library's own error type
            raise RuntimeBackendError(f"model {self.name!r} failed to start: {type(exc).__name__}: {exc}") from None
        self.ready = True

    async def stop(self, timeout: float | None = None) -> None:
        """Stop taking requests, finish the queued ones within `timeout` s (503 for the rest), release."""
        self.ready = False
        await self.batcher.stop(timeout)
        self.backend.deactivate()

    def abandon(self) -> None:
        """Answer the queued requests 503 now (a second stop signal)."""
        self.ready = False
        self.batcher.abandon()

    async def infer(self, feeds: dict[str, np.ndarray], rows: int) -> Outcome:
        self.metrics.queue_depth.labels(self.name).set(self.batcher.depth + 1)
        outcome = await self.batcher.submit(feeds, rows)
        self.metrics.queue_depth.labels(self.name).set(self.batcher.depth)
        self.metrics.queue_time.labels(self.name).observe(outcome.queue_s)
        self.stats.queue.add(outcome.queue_s)
        self.stats.compute_infer.add(outcome.compute_s)
        self.stats.last_inference_ms = int(time.time() * 1000)
        return outcome

    def statistics(self) -> dict:
        s = self.stats
        return {"name": self.name, "version": VERSION, "last_inference": s.last_inference_ms,
                "inference_count": s.inference_count, "execution_count": s.execution_count,
                "inference_stats": {"success": s.success.as_dict(), "fail": s.fail.as_dict(),
                                    "queue": s.queue.as_dict(), "compute_infer": s.compute_infer.as_dict()},
                "batch_stats": [{"batch_size": rows, "compute_infer": st.as_dict()}
                                for rows, st in sorted(dict(s.batches).items())]}
