"""The thermal controller: samples a sensor at 1-5 Hz, asks the policy, sets the LiveWindow, logs changes.

    controller = ThermalController(sensor, policy, live_window, max_window=1024)
    controller.start() ... controller.metrics_snapshot() ... controller.stop()

`step()` does one sample (tests drive it with a fake clock); `start()` runs it in a daemon thread.
A window of fraction 1.0 is set as 0 (full attention); others as round(fraction * max_window), at least
1. With a policy whose `budget` splits the rows (recent < 1), a level below 1.0 is a budget of
round(fraction * max_window) rows split into a window and retrieval pages (`budget_for`); the LiveWindow then
holds both. The op keeps the sink tokens; nothing here changes them. A locked LiveWindow is left alone and reported.
Sensor faults are logged with their detail and counted by (zone, fault kind), fixed values fit for metric
labels; a zone that was read and then lost is reported in `zones_lost` while it counts as hot.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

from edgeattn.attention.budget import AttentionBudget, check_page
from edgeattn.attention.ring import RingLayout
from edgeattn.errors import ConfigError
from edgeattn.runtime.live_window import LiveWindow
from edgeattn.runtime.thermal.faults import Fault
from edgeattn.runtime.thermal.policies import BudgetSplit, Decision, Policy, PolicyState
from edgeattn.runtime.thermal.readings import Reading, Sensor

log = logging.getLogger("edgeattn.thermal")


def window_for(fraction: float, max_window: int) -> int:
    return 0 if fraction >= 1.0 else max(1, round(fraction * max_window))


def budget_for(fraction: float, max_window: int, split: BudgetSplit = BudgetSplit()) -> tuple[int, int]:
    """(window, pages) of a level: the window alone for recent = 1.0 (`window_for`) or at fraction 1.0 (full
    attention); else round(fraction * max_window) rows, at least a page, split by `AttentionBudget.from_total`
    (the sinks come on top, as with a window)."""
    if split.window_only or fraction >= 1.0:
        return window_for(fraction, max_window), 0
    rows = max(split.page, round(fraction * max_window))
    budget = AttentionBudget.from_total(RingLayout(0, max_window), rows, page=split.page, recent=split.recent)
    return budget.window, budget.pages


class ThermalController:
    def __init__(self, sensor: Sensor, policy: Policy, window: LiveWindow, max_window: int, *,
                 hz: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        if not 1.0 <= hz <= 5.0:
            raise ConfigError(f"controller rate: expected 1-5 Hz (sensors update through firmware), found {hz}")
        if max_window < 1:
            raise ConfigError(f"max_window: expected >= 1, found {max_window}")
        split = getattr(policy, "budget", BudgetSplit())
        if not split.window_only:
            check_page(RingLayout(0, max_window), split.page)  # the pages must cut the ring evenly
        self.sensor, self.policy, self.window, self.max_window = sensor, policy, window, max_window
        self.split = split
        self.period_s, self.clock = 1.0 / hz, clock
        self.state = PolicyState()
        self.reading: Reading | None = None
        self.decision: Decision | None = None
        self.fault_counts: Counter[tuple[str, str]] = Counter()  # (zone, fault kind) -> samples
        self.zones: set[str] = set()  # every zone that has read or been lost
        self.changes = 0
        self.held_by_lock = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()

    def step(self) -> Decision:
        """Read once, decide, apply. A sensor that raises counts as a fault with no valid temperature."""
        try:
            reading = self.sensor.read()
        except Exception as exc:  # noqa: BLE001 - any sensor failure must end on the safe side
            fault = Fault("sensor", "read_error", f"read error ({type(exc).__name__}: {exc})")
            reading = Reading(t=self.clock(), faults=(fault,), trip_c=getattr(self.sensor, "trip_c", None))
        decision = self.policy.decide(reading, self.state)
        for fault in reading.faults:
            log.warning("thermal sensor fault: %s", fault)  # the detail (value, raw text, duration) goes here
        target, pages = budget_for(decision.fraction, self.max_window, self.split)
        applied = True
        if (target, pages) != (self.window.get(), self.window.pages):
            applied = self.window.set(target, source="controller", reason=decision.reason or "policy level",
                                      pages=pages)
            shown = f"{target or 'full'}" + (f" + {pages} pages of {self.split.page}" if pages else "")
            if applied:
                self.changes += 1
                log.info("thermal: window %s (%s)", shown, decision.reason)
            elif not self.held_by_lock:
                log.info("thermal: window locked; policy wanted %s (%s)", shown, decision.reason)
        self.held_by_lock = not applied
        with self._guard:
            self.state, self.reading, self.decision = decision.state, reading, decision
            self.fault_counts.update((f.zone, f.kind) for f in reading.faults)  # fixed values: zone, kind
            self.zones.update(reading.temps, reading.lost)
        return decision

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.step()
            except Exception:  # noqa: BLE001 - the loop must survive a bad sample; it is logged with its trace
                log.exception("thermal controller step failed")
            self._stop.wait(max(0.0, self.period_s - (time.monotonic() - started)))

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="edgeattn-thermal", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.sensor.close()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def metrics_snapshot(self) -> dict:
        """Plain values for Prometheus gauges and responses (None where unknown)."""
        with self._guard:
            r, d = self.reading, self.decision
            zones, counts = sorted(self.zones), sorted(self.fault_counts.items())
        budget = self.window.budget()
        window, pages = budget.window, budget.pages
        rows = (self.max_window if window == 0 else window) + pages * budget.page
        return {
            "temp_c": r.temp_c if r else None,
            "zone_temps_c": dict(r.temps) if r else {},
            "power_w": r.power_w if r else None,
            "clock_mhz": r.clock_mhz if r else None,
            "trip_c": r.trip_c if r else getattr(self.sensor, "trip_c", None),
            "throttle": bool(r.throttle) if r else False,
            "window": window,
            "window_fraction": 1.0 if window == 0 else window / self.max_window,
            "budget_pages": pages,  # retrieval pages beyond the window (0 = the window alone)
            "budget_fraction": 1.0 if window == 0 else min(rows / self.max_window, 1.0),
            "budget_recent": self.split.recent,
            "policy": self.policy.kind,
            "policy_fraction": d.fraction if d else None,
            "time_to_trip_s": d.time_to_trip_s if d else None,
            "window_changes": self.changes,
            "locked": self.window.locked,
            "zones_lost": {z: int(r is not None and z in r.lost) for z in zones},  # 1: counted as hot
            "sensor_faults": [str(f) for f in r.faults] if r else [],
            "sensor_fault_counts": {f"{zone}:{kind}": n for (zone, kind), n in counts},
            "running": self.running,
        }
