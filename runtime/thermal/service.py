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
