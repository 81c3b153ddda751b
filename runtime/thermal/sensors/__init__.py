"""Pick a sensor by name: auto (Jetson sysfs zones when present, else NVML), sysfs, nvml, replay:TRACE.csv."""

from __future__ import annotations

from pathlib import Path

from edgeattn.errors import ConfigError
from edgeattn.runtime.thermal.readings import Sensor


def open_sensor(source: str = "auto", gpu: int = 0) -> Sensor:
    from edgeattn.runtime.thermal.sensors.sysfs import THERMAL_ROOT

    if source.startswith("replay:"):
        from edgeattn.runtime.thermal.sensors.replay import ReplaySensor

        return ReplaySensor(Path(source.split(":", 1)[1]), loop=True)
    if source == "sysfs" or (source == "auto" and any(THERMAL_ROOT.glob("thermal_zone*"))):
        from edgeattn.runtime.thermal.sensors.sysfs import SysfsSensor

        return SysfsSensor()
    if source in ("nvml", "auto"):
        from edgeattn.runtime.thermal.sensors.nvml import NvmlSensor

        return NvmlSensor(gpu)
    raise ConfigError(f"thermal sensor: expected auto, sysfs, nvml or replay:TRACE.csv, found {source!r}")
