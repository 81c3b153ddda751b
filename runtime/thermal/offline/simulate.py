"""Replay a workload through a policy on the simulated device; summarize, and plot.

The loop drives the real ThermalController (fake clock = the device's clock), so simulation exercises
the same code the service runs. The device's load follows the rows attention reads: the window's, plus the
retrieval pages' when the policy splits a budget (`fraction` = rows / max window). Quality comes from the
window table at the same fraction of rows: retrieval pages are counted as if they were window rows, a
conservative stand-in until a table of budgets is measured.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from edgeattn import atomic
from edgeattn.optional import require
from edgeattn.runtime.live_window import LiveWindow
from edgeattn.runtime.thermal.controller import ThermalController
from edgeattn.runtime.thermal.policies import Policy
from edgeattn.runtime.thermal.offline.quality import QualityTable
from edgeattn.runtime.thermal.offline.simulated_device import RCModel, SimulatedDevice
from edgeattn.runtime.thermal.offline.workload import Workload


@dataclass(frozen=True)
class Summary:
    max_temp_c: float
    trip_c: float
    trip_crossings: int
    throttled_s: float
    mean_window_fraction: float
    window_changes: int
    window_changes_per_min: float
    mean_quality: float
    # requests served (offered load capped by capacity, 1 = full-window unthrottled capacity) times their
    # quality, over requests offered: 1.0 = every request served at full quality
    quality_weighted_throughput: float
    duration_s: float
    mean_pages: float = 0.0  # retrieval pages beyond the window, on average (0 with a window policy)


@dataclass(frozen=True)
class SimResult:
    series: dict[str, np.ndarray]  # t, temp_c, measured_c, power_w, fraction, latency_ms, load, throttled, pages
    summary: Summary


def simulate(model: RCModel, policy: Policy, workload: Workload, quality: QualityTable | None = None,
             seed: int | None = None) -> SimResult:
    dev = workload.device
    ambient = model.ambient_c if workload.ambient_c is None else workload.ambient_c
    temp0 = workload.temp0_c if workload.temp0_c is not None else ambient + model.r_c_per_w * dev.idle_w
    device = SimulatedDevice(model, dev, noise_c=workload.noise_c, seed=workload.seed if seed is None else seed,
                             temp0_c=temp0, ambient_c=ambient)
    window = LiveWindow(0, max_window=workload.max_window)
    controller = ThermalController(device, policy, window, workload.max_window, hz=workload.hz, clock=device.clock)
    dt = 1.0 / workload.hz
    steps = int(round(workload.duration_s / dt))
    cols = {k: np.empty(steps) for k in ("t", "temp_c", "measured_c", "power_w", "fraction", "latency_ms", "load",
                                          "throttled", "pages")}
    for k in range(steps):
        device.set_load(workload.load_at(device.t))
        decision = controller.step()
        budget = window.budget()
        rows = budget.window + budget.pages * budget.page
        device.set_window_fraction(1.0 if budget.window == 0 else min(rows / workload.max_window, 1.0))
        row = (device.t, device.temp_c, controller.reading.temp_c, device.power_w, device.fraction,
               dev.latency_ms(device.fraction, device.throttled), device.load, float(device.throttled),
               float(budget.pages))
        for name, value in zip(cols, row):
            cols[name][k] = np.nan if value is None else value
        del decision
        device.advance(dt)
    return SimResult(cols, summarize(cols, dev.trip_c, controller.changes, dev.base_latency_ms, quality))


def summarize(cols: dict[str, np.ndarray], trip_c: float, changes: int, base_latency_ms: float,
              quality: QualityTable | None) -> Summary:
    hot = cols["temp_c"] >= trip_c
    crossings = int(np.sum(hot[1:] & ~hot[:-1]) + hot[0])
    dt = float(np.median(np.diff(cols["t"]))) if len(cols["t"]) > 1 else 1.0
    duration = len(cols["t"]) * dt
    q = np.array([quality.quality(f) if quality else 1.0 for f in cols["fraction"]])
    served = np.minimum(cols["load"], base_latency_ms / cols["latency_ms"])  # offered load, capped by capacity
    qwt = float(np.sum(served * q) / max(np.sum(cols["load"]), 1e-9))
    return Summary(max_temp_c=float(cols["temp_c"].max()), trip_c=trip_c, trip_crossings=crossings,
                   throttled_s=float(hot.sum() * dt), mean_window_fraction=float(cols["fraction"].mean()),
                   window_changes=changes, window_changes_per_min=changes / (duration / 60.0),
                   mean_quality=float(q.mean()), quality_weighted_throughput=qwt, duration_s=duration,
                   mean_pages=float(cols["pages"].mean()) if "pages" in cols else 0.0)


def plot(result: SimResult, path: Path, title: str = "") -> None:
    """Temperature, window and latency over time, as a 1000x750 PNG."""
    matplotlib = require("matplotlib", "plotting the simulation")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s, summary = result.series, result.summary
    fig, (ax_t, ax_w, ax_l) = plt.subplots(3, 1, figsize=(10, 7.5), dpi=100, sharex=True)
    ax_t.plot(s["t"], s["measured_c"], lw=0.5, color="0.6", label="sensor")
    ax_t.plot(s["t"], s["temp_c"], lw=1.2, color="C3", label="device")
    ax_t.axhline(summary.trip_c, ls="--", color="k", lw=0.8, label=f"trip {summary.trip_c:g} C")
    ax_t.set_ylabel("temperature (C)")
    ax_t.legend(loc="lower right", fontsize=8)
    ax_w.step(s["t"], s["fraction"], where="post", color="C0")
    ax_w.fill_between(s["t"], 0, s["load"], step="post", color="C2", alpha=0.15, label="load")
    ax_w.set_ylim(0, 1.05)
    ax_w.set_ylabel("window (fraction)")
    ax_w.legend(loc="lower right", fontsize=8)
    ax_l.plot(s["t"], s["latency_ms"], color="C1")
    ax_l.set_ylabel("latency (ms)")
    ax_l.set_xlabel("time (s)")
    fig.suptitle(title or f"max {summary.max_temp_c:.1f} C, {summary.trip_crossings} trip crossings, mean window "
                 f"{summary.mean_window_fraction:.2f}, {summary.window_changes_per_min:.2f} changes/min")
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, format="png")
    plt.close(fig)
    tmp.replace(path)


def write_outputs(result: SimResult, out: Path, title: str = "", extra: dict | None = None) -> None:
    """DIR/summary.json, DIR/simulation.png, DIR/series.csv, written as one folder atomically."""
    from edgeattn.runtime.thermal.sensors.trace import rows_to_csv

    with atomic.directory(Path(out)) as staging:
        (staging / "summary.json").write_text(json.dumps({**asdict(result.summary), **(extra or {})}, indent=2) + "\n")
        plot(result, staging / "simulation.png", title)
        s = result.series
        rows = [{k: round(float(v[i]), 4) for k, v in s.items()} for i in range(len(s["t"]))]
        (staging / "series.csv").write_text(rows_to_csv(rows))
