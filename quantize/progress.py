"""Progress of long work (pruning layers, fine-tuning and QAT steps), told through the same `progress`
callback as the stage's text lines.

A stage's callback receives either a line of text or a `StepProgress`: how much of one task is done, and
for how long it has run. `str()` of it is a readable line with a time estimate, so a callback that prints
what it gets works unchanged; the CLI draws a bar for it on a terminal and a line now and then elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass


def clock(seconds: float) -> str:
    """1:05 or 1:02:05."""
    seconds = max(int(round(seconds)), 0)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


@dataclass(frozen=True)
class StepProgress:
    task: str  # "pruning", "fine-tuning", "QAT", ...
    done: int  # steps (or layers) finished
    total: int  # steps (or layers) in all; a time budget may end the task sooner
    elapsed_s: float  # since the task began
    fraction: float | None = None  # share done when it is not done / total (a time budget); None: done / total
    loss: float | None = None
    unit: str = "step"

    @property
    def share(self) -> float:
        if self.fraction is not None:
            return min(max(self.fraction, 0.0), 1.0)
        return min(self.done / self.total, 1.0) if self.total > 0 else 1.0

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the rate so far; None before the first step is done."""
        share = self.share
        if share <= 0 or self.done <= 0:
            return None
        return self.elapsed_s * (1.0 - share) / share

    @property
    def finished(self) -> bool:
        return self.share >= 1.0

    def __str__(self) -> str:
        eta = self.eta_s
        left = "done" if self.finished else (f"about {clock(eta)} left" if eta is not None else "estimating")
        loss = f", loss {self.loss:.4g}" if self.loss is not None else ""
        return (f"{self.task}: {self.unit} {self.done}/{self.total} ({self.share:.0%}), {clock(self.elapsed_s)} "
                f"elapsed, {left}{loss}")
