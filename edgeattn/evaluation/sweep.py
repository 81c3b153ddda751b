"""A table of runs: tasks x contexts x attention settings on one bundle, written as JSON and plotted.

For each context C the settings are full attention, then for each size N (C / d for each divisor d, and any
sizes given outright) a window of N (sinks + N rows read) and a budget of N rows. The JSON is rewritten
(atomically) after every run, so a long sweep stopped part way keeps what it measured. The plot has one panel
per context: accuracy against the rows a query reads, one line per task and setting kind, full attention as a
dashed level.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from edgeattn import atomic
from edgeattn.errors import ConfigError
from edgeattn.evaluation.runner import (EvalConfig, EvalResult, Progress, check_context, check_setting, prompt_counter,
                                       run_eval)
from edgeattn.evaluation.settings import DEFAULT_RECENT, KINDS, AttentionSetting
from edgeattn.evaluation.tasks import check_form, get_task, make_sample
from edgeattn.optional import require
from edgeattn.runtime.generation.generator import Generator


def _ints(name: str, values, low: int) -> None:
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < low for v in values):
        raise ConfigError(f"{name}: expected one or more integers >= {low}, found {list(values)!r}")


@dataclass(frozen=True)
class SweepConfig:
    tasks: tuple[str, ...] = ("passkey",)
    contexts: tuple[int, ...] = (1024, 2048, 4096, 8192)
    kinds: tuple[str, ...] = KINDS
    divisors: tuple[int, ...] = (2, 4, 8, 16)  # sizes C / d
    sizes: tuple[int, ...] = ()  # sizes given outright, at every context
    samples: int = 50
    seed: int = 0
    recent: float = DEFAULT_RECENT
    max_tokens: int | None = None
    prompt_form: str | None = None  # chat or raw; None: each task's default
    prompt: str = "budget"  # what the prompt reads under a window or budget: "budget" or "whole"

    def __post_init__(self) -> None:
        for task in self.tasks or ("",):
            get_task(task)
        if self.prompt_form is not None:
            check_form(self.prompt_form)
        AttentionSetting(prompt=self.prompt)
        _ints("contexts", self.contexts, 1)
        bad = [k for k in self.kinds if k not in KINDS]
        if not self.kinds or bad:
            raise ConfigError(f"settings: expected some of {', '.join(KINDS)}, found {list(self.kinds)!r}")
        if self.divisors:
            _ints("divisors", self.divisors, 2)
        if self.sizes:
            _ints("sizes", self.sizes, 1)
        if not self.divisors and not self.sizes and set(self.kinds) - {"full"}:
            raise ConfigError("sizes: expected divisors or sizes for the window and budget settings, found neither")

    def settings(self, context: int) -> list[AttentionSetting]:
        sizes = sorted({context // d for d in self.divisors} | {s for s in self.sizes if s < context}, reverse=True)
        out = [AttentionSetting()] if "full" in self.kinds else []
        for kind in ("window", "budget"):
            if kind in self.kinds:
                out += [AttentionSetting(kind, n, self.recent if kind == "budget" else DEFAULT_RECENT, self.prompt)
                        for n in sizes if n >= 1]
        return out

    def runs(self) -> list[EvalConfig]:
        return [EvalConfig(task, context, setting, self.samples, self.seed, self.max_tokens,
                           prompt_form=self.prompt_form)
                for task in self.tasks for context in self.contexts for setting in self.settings(context)]


def run_sweep(gen: Generator, config: SweepConfig, out: Path, *, plot: Path | None = None,
              progress: Progress | None = None, about: dict | None = None) -> list[EvalResult]:
    """Every run of the sweep in order; `out` (JSON) rewritten after each, `plot` drawn at the end."""
    runs = config.runs()
    for run in runs:  # every bad context, setting or task size fails before the first sample
        check_context(gen, run.context)
        check_setting(gen, run.setting)
    for task, context, tokens, form in {(r.task, r.context, r.new_tokens, r.form) for r in runs}:
        make_sample(task, context, 0, prompt_counter(gen, form), seed=config.seed, max_tokens=tokens, form=form)
    header = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "nproc": os.cpu_count(),
              "load_before": [round(x, 2) for x in os.getloadavg()], "sinks": gen.model.layout.sinks,
              "window_max": gen.model.layout.window_max, **(about or {}),
              "config": {"tasks": list(config.tasks), "contexts": list(config.contexts), "kinds": list(config.kinds),
                         "divisors": list(config.divisors), "sizes": list(config.sizes), "samples": config.samples,
                         "seed": config.seed, "recent": config.recent, "max_tokens": config.max_tokens,
                         "prompt_form": config.prompt_form, "prompt": config.prompt}}
    results: list[EvalResult] = []
    start = time.perf_counter()
    for i, run in enumerate(runs):
        if progress is not None:
            progress(f"run {i + 1}/{len(runs)}: {run.task} at {run.context} tokens, {run.setting.label}")
        results.append(run_eval(gen, run, progress=progress))
        write_results(out, header | {"load_after": [round(x, 2) for x in os.getloadavg()],
                                     "seconds": round(time.perf_counter() - start, 1)}, results)
    if plot is not None:
        plot_results([r.to_dict() for r in results], plot)
    return results


def write_results(path: Path, header: dict, results: list[EvalResult]) -> None:
    atomic.write_text(Path(path), json.dumps(header | {"results": [r.to_dict() for r in results]}, indent=1) + "\n")


def plot_results(rows: list[dict], path: Path, title: str = "") -> None:
    """Accuracy against rows read, a panel per context; written atomically (PNG, or what the suffix says)."""
    matplotlib = require("matplotlib", "the evaluation plot")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contexts = sorted({r["context"] for r in rows})
    fig, axes = plt.subplots(1, len(contexts), figsize=(4.2 * len(contexts), 3.6), squeeze=False, sharey=True)
    for ax, context in zip(axes[0], contexts):
        here = [r for r in rows if r["context"] == context]
        for task in sorted({r["task"] for r in here}):
            for r in (r for r in here if r["task"] == task and r["setting"]["kind"] == "full"):
                ax.axhline(r["accuracy"], linestyle="--", color="gray", label=f"{task}: full")
            for kind, marker in (("window", "o"), ("budget", "s")):
                for prompt in ("budget", "whole"):
                    line = sorted((r["rows"], r["accuracy"]) for r in here if r["task"] == task
                                  and r["setting"]["kind"] == kind and r["setting"].get("prompt", "budget") == prompt)
                    if line:
                        ax.plot(*zip(*line), marker=marker, linestyle="-" if prompt == "budget" else ":",
                                label=f"{task}: {kind}" + (", prompt whole" if prompt == "whole" else ""))
        ax.set_xscale("log", base=2)
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(f"context {context} tokens")
        ax.set_xlabel("rows read per query")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("accuracy (exact match)")
    axes[0][-1].legend(fontsize=8, loc="lower right")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp{path.suffix}")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(tmp, dpi=110)
        atomic.publish(tmp, path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
