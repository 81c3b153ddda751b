"""Discrete-GPU sensor through NVML (`nvidia-ml-py`, module `pynvml`), imported when the sensor opens.

Throttle = the clocks-event reasons hold SW thermal (0x20) or HW thermal (0x40) slowdown. The trip point
is the GPU's slowdown threshold.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType

from edgeattn.errors import InputError
from edgeattn.optional import require
from edgeattn.runtime.thermal.faults import DEFAULT_FAULTS, FaultConfig, ZoneGuard
from edgeattn.runtime.thermal.readings import Reading

SW_THERMAL = 0x20
HW_THERMAL = 0x40


class NvmlSensor:
    def __init__(self, index: int = 0, nvml: ModuleType | None = None, faults: FaultConfig = DEFAULT_FAULTS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.nvml = nvml or require("pynvml", "reading GPU temperature and power (pip install nvidia-ml-py)")
        self.clock = clock
        try:
            self.nvml.nvmlInit()
            self.handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
        except self.nvml.NVMLError as exc:
            raise InputError(f"NVML could not open GPU {index}: {exc} (is an NVIDIA driver loaded?)") from exc
        self.zone = f"gpu{index}"
        self._guard = ZoneGuard(self.zone, faults)
        self.trip_c = self._optional(self.nvml.nvmlDeviceGetTemperatureThreshold, self.handle,
                                     self.nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)

    def _optional(self, fn: Callable, *args) -> float | None:
        try:
            return float(fn(*args))
        except self.nvml.NVMLError:
            return None

    def _reasons(self) -> int:
        get = getattr(self.nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        value = self._optional(get, self.handle)
        return int(value) if value is not None else 0

    def read(self) -> Reading:
        t = self.clock()
        try:
            raw: object = self.nvml.nvmlDeviceGetTemperature(self.handle, self.nvml.NVML_TEMPERATURE_GPU)
        except self.nvml.NVMLError as exc:
            raw = exc
        power_mw = self._optional(self.nvml.nvmlDeviceGetPowerUsage, self.handle)
        value, fault = self._guard.check(raw, t, power_mw / 1000.0 if power_mw is not None else None)
        clock = self._optional(self.nvml.nvmlDeviceGetClockInfo, self.handle, self.nvml.NVML_CLOCK_SM)
        reasons = self._reasons()
        return Reading(t=t, temps={self.zone: value} if value is not None else {},
                       power_w=power_mw / 1000.0 if power_mw is not None else None, clock_mhz=clock,
                       throttle=bool(reasons & (SW_THERMAL | HW_THERMAL)), trip_c=self.trip_c,
                       faults=(fault,) if fault else (),
                       lost=(self.zone,) if self._guard.lost else ())

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass
