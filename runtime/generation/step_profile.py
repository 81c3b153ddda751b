"""Where the decode engine's iterations spend their time: per-phase totals and the recent iterations.

The worker thread adds the time of each phase of an iteration (admitting jobs, the prefill chunk's model call,
the decode step's model call, sampling, detokenizing and stop strings, slot moves, handing events to the event
loop, waiting for work); the event loop adds how long an iteration's events waited before it routed them
(`loop_lag`: the loop busy with other work, or starved of CPU). Totals only grow, so two snapshots taken around
a run give that run's figures by subtraction; `recent` keeps the last iterations one by one, for percentiles.
"""

from __future__ import annotations

import threading
from collections import deque

PHASES = ("admit", "prefill_model", "decode_model", "sample", "accept", "compact", "deliver", "wait", "loop_lag")


class StepProfile:
    """Thread-safe: the worker writes, the event loop writes `loop_lag` and reads `snapshot()`."""

    def __init__(self, keep: int = 512) -> None:
        self._lock = threading.Lock()
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.counts = dict.fromkeys(PHASES, 0)
        self.iterations = 0
        # (iteration, decode rows, prefill-chunk tokens, iteration s, decode model s, prefill model s)
        self.recent: deque[tuple[int, int, int, float, float, float]] = deque(maxlen=keep)

    def add(self, phase: str, seconds: float) -> None:
        with self._lock:
            self.seconds[phase] += seconds
            self.counts[phase] += 1

    def iteration(self, rows: int, prefill_tokens: int, seconds: float, decode_s: float, prefill_s: float) -> None:
        with self._lock:
            self.iterations += 1
            self.recent.append((self.iterations, rows, prefill_tokens, seconds, decode_s, prefill_s))

    def snapshot(self) -> dict:
        """{"iterations", "seconds": {phase: total}, "counts": {phase: n}, "recent": [[i, rows, prefill_tokens,
        iteration_ms, decode_model_ms, prefill_model_ms], ...]}."""
        with self._lock:
            return {"iterations": self.iterations, "seconds": dict(self.seconds), "counts": dict(self.counts),
                    "recent": [[i, rows, pre, round(1e3 * s, 3), round(1e3 * d, 3), round(1e3 * p, 3)]
                               for i, rows, pre, s, d, p in self.recent]}
