"""Device readings for /metrics: sysfs thermal zones and hwmon power, and snapshot sources."""

from __future__ import annotations

import math

from prometheus_client import generate_latest

from edgeattn.runtime.server.metrics import ServerMetrics, sysfs_sensors


def _write(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_sysfs_sensors_read_zones_and_power(tmp_path):
    _write(tmp_path / "thermal/thermal_zone0/type", "gpu-thermal\n")
    _write(tmp_path / "thermal/thermal_zone0/temp", "61500\n")
    _write(tmp_path / "thermal/thermal_zone1/type", "cv0-thermal\n")
    _write(tmp_path / "thermal/thermal_zone1/temp", "-256000\n")  # a powered-off block
    _write(tmp_path / "thermal/thermal_zone2/type", "soc0-thermal\n")
    _write(tmp_path / "thermal/thermal_zone2/temp", "")  # unreadable
    _write(tmp_path / "hwmon/hwmon0/name", "ina3221\n")
    _write(tmp_path / "hwmon/hwmon0/power1_input", "7250000\n")
    assert sysfs_sensors(tmp_path)() == {"temperature_celsius": {"gpu-thermal": 61.5},
                                         "power_watts": {"ina3221/power1": 7.25}}
    assert sysfs_sensors(tmp_path / "absent")() == {}


def test_sources_become_gauges_and_failures_are_skipped():
    metrics = ServerMetrics()
    metrics.add_source(lambda: {"temperature_celsius": {"cpu": 48.0, "gpu": math.nan}, "throttled": 0})
    metrics.add_source(lambda: 1 / 0)
    text = generate_latest(metrics.registry).decode()
    assert 'edgeattn_device_temperature_celsius{sensor="cpu"} 48.0' in text
    assert 'sensor="gpu"' not in text
    assert "edgeattn_device_throttled 0.0" in text
