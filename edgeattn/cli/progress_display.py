"""Progress of long commands on stderr: what the stage says, and how far its long tasks are.

On a terminal a task (pruning, fine-tuning, QAT) is a rich bar with steps done / total, the time elapsed and
an estimate of the time left; elsewhere (a log file, CI) it is a plain line when the task starts, every
`line_every_s` seconds and when it ends. `--quiet` shows neither, nor the stage's progress lines.
"""

from __future__ import annotations

import time
from typing import Callable

from edgeattn.quantize.progress import StepProgress

LINE_EVERY_S = 30.0


class ProgressDisplay:
    """A `progress` callback for the library (text or StepProgress); use it as a context manager."""

    def __init__(self, *, quiet: bool = False, console=None, line_every_s: float = LINE_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self.quiet, self.line_every_s, self.clock = quiet, line_every_s, clock
        self.bars = None
        self._tasks: dict[str, int] = {}  # task name -> rich task id
        self._last_line: dict[str, float] = {}  # task name -> when its last plain line was printed

    def __enter__(self) -> "ProgressDisplay":
        if self.console.is_terminal and not self.quiet:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self.bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), console=self.console)
            self.bars.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.bars is not None:
            self.bars.stop()
            self.bars = None

    def __call__(self, message) -> None:
        if self.quiet:
            return
        if isinstance(message, StepProgress):
            self.step(message)
        else:
            self.console.print(str(message), soft_wrap=True, markup=False, highlight=False)

    def step(self, p: StepProgress) -> None:
        if self.bars is not None:
            self._bar(p)
            return
        now = self.clock()
        last = self._last_line.get(p.task)
        if last is None or p.finished or now - last >= self.line_every_s:
            self._last_line[p.task] = now
            self.console.print(str(p), soft_wrap=True, markup=False, highlight=False)
        if p.finished:
            self._last_line.pop(p.task, None)  # a later task of the same name starts afresh

    def _bar(self, p: StepProgress) -> None:
        from edgeattn.quantize.progress import clock

        eta = p.eta_s
        info = f"{clock(p.elapsed_s)} elapsed" + ("" if p.finished else
                                                  f", {clock(eta)} left" if eta is not None else ", estimating")
        if p.loss is not None:
            info += f", loss {p.loss:.4g}"
        if p.task not in self._tasks:
            self._tasks[p.task] = self.bars.add_task(p.task, total=p.total, info=info)
        self.bars.update(self._tasks[p.task], completed=p.done, total=p.total, info=info)
        if p.finished:
            self._tasks.pop(p.task)
