"""Replay a recorded trace as a sensor: each `read()` returns the row at the clock's elapsed time."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from edgeattn.runtime.thermal.faults import DEFAULT_FAULTS, FaultConfig, ZoneGuard
from edgeattn.runtime.thermal.readings import Reading
from edgeattn.runtime.thermal.sensors.trace import read_trace


class ReplaySensor:
    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic, trip_c: float | None = None,
                 loop: bool = False, faults: FaultConfig = DEFAULT_FAULTS) -> None:
        self.trace = read_trace(path)
        self.clock, self.trip_c, self.loop = clock, trip_c, loop
        self._t0 = clock()
        self._guard = ZoneGuard("trace", faults)
        self.zone = "trace"

    def read(self) -> Reading:
        now = self.clock()
        t = self.trace["t"]
        elapsed = now - self._t0
        if self.loop and t[-1] > t[0]:
            elapsed = t[0] + (elapsed % (t[-1] - t[0]))
        i = min(int(np.searchsorted(t, elapsed, side="right")) - 1, len(t) - 1)
        i = max(i, 0)
        temp, power = self.trace["temp_c"][i], self.trace["power_w"][i]
        value, fault = self._guard.check(None if math.isnan(temp) else float(temp), now,
                                         None if math.isnan(power) else float(power))
        throttle = "throttle" in self.trace.columns and self.trace["throttle"][i] == 1
        return Reading(t=now, temps={self.zone: value} if value is not None else {},
                       power_w=None if math.isnan(power) else float(power), throttle=bool(throttle),
                       trip_c=self.trip_c, faults=(fault,) if fault else (),
                       lost=(self.zone,) if self._guard.lost else ())

    def close(self) -> None:
        pass
