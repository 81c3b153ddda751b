"""The thermal controller as the service runs it: built from a policy file and a sensor name."""

from __future__ import annotations

from pathlib import Path

from edgeattn.runtime.live_window import LiveWindow
from edgeattn.runtime.thermal.controller import ThermalController
from edgeattn.runtime.thermal.policy_file import load_policy
from edgeattn.runtime.thermal.sensors import open_sensor

# what each response carries of the controller's state (KServe response parameters)
RESPONSE_KEYS = {"temp_c": "device_temp_c", "throttle": "device_throttle", "power_w": "device_power_w"}


def thermal_controller(window: LiveWindow, *, policy: Path, sensor: str = "auto", max_window: int,
                       hz: float = 2.0, gpu: int = 0) -> ThermalController:
    """A controller that drives `window` from `sensor` (NVML: GPU `gpu`) through the policy in `policy`."""
    return ThermalController(open_sensor(sensor, gpu), load_policy(Path(policy)), window, max_window, hz=hz)


def response_parameters(controller) -> dict:
    """Temperature, throttle state and power for a response's parameters (absent values left out)."""
    snapshot = controller.metrics_snapshot()
    return {name: snapshot[key] for key, name in RESPONSE_KEYS.items() if snapshot.get(key) is not None}


class ControllerGroup:
    """The controllers of several GPUs (serve --devices), each moving its own GPU's window, started and stopped
    together; `metrics_snapshot` gives every GPU's zones, the hottest temperature, the summed power, and throttle
    when any GPU throttles (the rest as the first controller says)."""

    def __init__(self, controllers: list[ThermalController]) -> None:
        self.controllers = controllers
        self.split = controllers[0].split

    def start(self) -> None:
        for c in self.controllers:
            c.start()

    def stop(self) -> None:
        for c in self.controllers:
            c.stop()

    def metrics_snapshot(self) -> dict:
        snaps = [c.metrics_snapshot() for c in self.controllers]
        merged = dict(snaps[0])
        merged["zone_temps_c"] = {z: t for s in snaps for z, t in s["zone_temps_c"].items()}
        temps = [s["temp_c"] for s in snaps if s["temp_c"] is not None]
        powers = [s["power_w"] for s in snaps if s["power_w"] is not None]
        merged["temp_c"] = max(temps) if temps else None
        merged["power_w"] = sum(powers) if powers else None
        merged["throttle"] = any(s["throttle"] for s in snaps)
        return merged
