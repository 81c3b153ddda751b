"""The controller with a fake clock and the simulated device: window changes, lock, faults, metrics, thread."""

from __future__ import annotations

import time

import pytest

from edgeattn.errors import ConfigError
from edgeattn.runtime.live_window import LiveWindow
from edgeattn.runtime.thermal.controller import ThermalController, window_for
from edgeattn.runtime.thermal.policies import StepPolicy
from edgeattn.runtime.thermal.readings import Reading
from edgeattn.runtime.thermal.offline.simulated_device import DevicePower, RCModel, SimulatedDevice

MODEL = RCModel(r_c_per_w=2.0, c_j_per_c=30.0, ambient_c=40.0)  # tau 60 s; full load at full window: 110 C


def heat(controller, device, seconds, dt=0.5):
    for _ in range(int(seconds / dt)):
        controller.step()
        w = controller.window.get()
        device.set_window_fraction(1.0 if w == 0 else w / controller.max_window)
        device.advance(dt)


def test_window_for_keeps_full_as_zero():
    assert [window_for(f, 1024) for f in (1.0, 0.5, 0.25, 0.0001)] == [0, 512, 256, 1]


def test_controller_shrinks_the_window_as_the_device_heats_and_logs_each_change(caplog):
    device = SimulatedDevice(MODEL, DevicePower(trip_c=99.0), temp0_c=50.0)
    device.set_load(1.0)
    window = LiveWindow(0, max_window=1024)
    c = ThermalController(device, StepPolicy(thresholds_c=(75, 85)), window, 1024, hz=2, clock=device.clock)
    with caplog.at_level("INFO", logger="edgeattn.thermal"):
        heat(c, device, 600)
    assert [(h.old, h.new, h.source) for h in window.history][:2] == [(0, 512, "controller"), (512, 256, "controller")]
    assert all(h.reason for h in window.history)
    assert sum("thermal: window" in m for m in caplog.messages) == c.changes == len(window.history)
    m = c.metrics_snapshot()
    assert m["window"] == window.get() and m["window_fraction"] == window.get() / 1024
    assert m["temp_c"] == pytest.approx(device.temp_c) and m["trip_c"] == 99.0 and m["throttle"] is False
    assert m["power_w"] == pytest.approx(device.power_w) and m["sensor_faults"] == [] and m["policy"] == "step"
    assert device.temp_c < 99.0


def test_locked_window_is_left_alone_and_reported():
    device = SimulatedDevice(MODEL, temp0_c=90.0)
    window = LiveWindow(0, max_window=512)
    window.lock(0)
    c = ThermalController(device, StepPolicy(), window, 512, clock=device.clock)
    d = c.step()
    assert d.fraction == 0.25 and window.get() == 0 and c.held_by_lock and c.metrics_snapshot()["locked"]
    window.unlock()
    c.step()
    assert window.get() == 128 and not c.held_by_lock


class BrokenSensor:
    trip_c = 99.0

    def read(self) -> Reading:
        raise OSError("i2c timeout")

    def close(self) -> None:
        pass


def test_sensor_exception_ends_on_the_safe_side_and_is_counted():
    window = LiveWindow(0, max_window=512)
    c = ThermalController(BrokenSensor(), StepPolicy(), window, 512, clock=lambda: 5.0)
    c.step()
    c.step()
    m = c.metrics_snapshot()
    assert window.get() == 128 and m["temp_c"] is None
    assert m["sensor_fault_counts"] == {"sensor:read_error": 2}
    assert m["sensor_faults"] == ["sensor: read error (OSError: i2c timeout)"]


def test_thread_samples_at_the_rate_and_stops():
    device = SimulatedDevice(MODEL, temp0_c=80.0)
    window = LiveWindow(0, max_window=256)
    c = ThermalController(device, StepPolicy(), window, 256, hz=5)
    c.start()
    time.sleep(0.5)
    assert c.running and window.get() == 128
    c.stop()
    assert not c.running


def test_rate_outside_1_to_5_hz_is_refused():
    with pytest.raises(ConfigError, match="1-5 Hz"):
        ThermalController(BrokenSensor(), StepPolicy(), LiveWindow(), 512, hz=10)


def test_thermal_runtime_and_cli_import_nothing_heavy():
    import subprocess
    import sys

    modules = ["controller", "policies", "policy_file", "sensors.sysfs", "sensors.nvml", "sensors.replay",
               "offline.simulated_device", "offline.fit", "offline.simulate", "offline.tune", "offline.quality",
               "offline.workload", "sensors.trace", "faults", "metrics", "sensors"]
    code = ("import sys\n" + "".join(f"import edgeattn.runtime.thermal.{m}\n" for m in modules) +
            "from edgeattn.cli.main import main\n"
            "try:\n    main(['thermal', '--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'tensorrt', 'tensorrt_rtx', "
            "'triton', 'transformers', 'cuda', 'pynvml', 'matplotlib', 'scipy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_prometheus_collector_exports_temperature_window_and_faults():
    prometheus_client = pytest.importorskip("prometheus_client")
    from edgeattn.runtime.thermal.metrics import ThermalCollector

    device = SimulatedDevice(MODEL, temp0_c=80.0)
    window = LiveWindow(0, max_window=512)
    c = ThermalController(device, StepPolicy(), window, 512, clock=device.clock)
    c.step()
    c.fault_counts["gpu0", "invalid"] += 2
    registry = prometheus_client.CollectorRegistry()
    registry.register(ThermalCollector(c))
    text = prometheus_client.generate_latest(registry).decode()
    assert 'edgeattn_thermal_temperature_celsius{zone="sim"} 80.0' in text
    assert "edgeattn_attention_window 256.0" in text and "edgeattn_attention_window_fraction 0.5" in text
    assert "edgeattn_thermal_throttle 0.0" in text and "edgeattn_thermal_trip_celsius 99.0" in text
    assert "edgeattn_thermal_window_changes_total 1.0" in text
    assert 'edgeattn_thermal_sensor_faults_total{kind="invalid",zone="gpu0"} 2.0' in text
