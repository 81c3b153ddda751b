"""A hot zone that is lost, and the sensor-fault metric (issue 19, items 13 and 14).

13: when the hottest zone disappeared or read -256 C, the controller held its last value for `stale_s`, then
dropped it and followed the cooler zones back to full attention within 15 s while the hot block's real
temperature was unknown. A zone that was read and then lost now counts as hot until it has read normally
for `recover_s`, and /metrics says which zone is lost.
14: the fault counter's label was the fault text ("stuck at 60.0 C for 482 s", raw reads such as 'hot!'), a
new time series every sample. Labels now take fixed values (zone, fault kind); the text goes to the log.

Real sysfs sensor over a fake tree, real policy, controller and both /metrics collectors (the thermal one and
the server's device collector that the service registers the controller with), driven by a fake clock.
"""

from __future__ import annotations

import re
import shutil

import pytest

from edgeattn.runtime.live_window import LiveWindow
from edgeattn.runtime.thermal.controller import ThermalController
from edgeattn.runtime.thermal.faults import FaultConfig
from edgeattn.runtime.thermal.policies import StepPolicy
from edgeattn.runtime.thermal.sensors.sysfs import SysfsSensor
from thermal_fakes import jetson_tree, set_temp

prometheus_client = pytest.importorskip("prometheus_client")

MAX_WINDOW = 1024
SMALLEST = 256  # StepPolicy's default levels (1.0, 0.5, 0.25) of 1024


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _controller(tmp_path, zones, faults=FaultConfig()):
    thermal, hwmon = jetson_tree(tmp_path, zones, {"tj-thermal": [("passive", 99000)]})
    clock = Clock()
    window = LiveWindow(0, max_window=MAX_WINDOW)
    c = ThermalController(SysfsSensor(thermal, hwmon, faults=faults, clock=clock), StepPolicy(), window,
                          MAX_WINDOW, hz=2, clock=clock)
    return c, thermal, clock


def _run(c, clock, seconds, dt=0.5) -> list[int]:
    """Step for `seconds`; the window after each step."""
    windows = []
    for _ in range(int(seconds / dt)):
        clock.t += dt
        c.step()
        windows.append(c.window.get())
    return windows


def _scrape(c) -> str:
    from edgeattn.runtime.server.metrics import ServerMetrics
    from edgeattn.runtime.thermal.metrics import ThermalCollector

    server = ServerMetrics()
    server.add_source(c.metrics_snapshot)  # what the service does with its controller
    server.registry.register(ThermalCollector(c))
    return prometheus_client.generate_latest(server.registry).decode()


def _lose(thermal, how):
    if how == "invalid":
        set_temp(thermal, 2, "-256000\n")
    else:
        shutil.rmtree(thermal / "thermal_zone2")


@pytest.mark.parametrize("how", ["invalid", "gone"])
def test_a_lost_hot_zone_counts_as_hot_until_it_reads_normally_for_a_while(tmp_path, how):
    c, thermal, clock = _controller(tmp_path, {"cpu-thermal": "60000\n", "gpu-thermal": "62000\n",
                                               "tj-thermal": "90000\n"})
    assert _run(c, clock, 20)[-1] == SMALLEST  # 90 C: past both thresholds
    _lose(thermal, how)
    lost = _run(c, clock, 60)
    assert set(lost) == {SMALLEST}  # was: full attention again within 15 s, following the 62 C zone
    m = c.metrics_snapshot()
    assert m["temp_c"] is None and m["zone_temps_c"] == {"cpu-thermal": 60.0, "gpu-thermal": 62.0}
    assert m["zones_lost"] == {"cpu-thermal": 0, "gpu-thermal": 0, "tj-thermal": 1}
    text = _scrape(c)
    assert 'edgeattn_thermal_zone_lost{zone="tj-thermal"} 1.0' in text
    assert 'edgeattn_thermal_zone_lost{zone="gpu-thermal"} 0.0' in text
    assert 'edgeattn_device_zones_lost{sensor="tj-thermal"} 1.0' in text
    assert "edgeattn_thermal_hottest_celsius" not in text  # unknown, not the cooler zones' 62 C

    if how == "gone":
        (thermal / "thermal_zone2").mkdir()
        (thermal / "thermal_zone2" / "type").write_text("tj-thermal\n")
    set_temp(thermal, 2, "70000\n")  # back, and cool
    recover_s = FaultConfig().recover_s
    back = _run(c, clock, recover_s + 2)
    held = back[:int((recover_s - 1) / 0.5)]
    assert set(held) == {SMALLEST} and back[-1] == 0  # trusted again after recover_s of normal reads
    m = c.metrics_snapshot()
    assert m["temp_c"] == 70.0 and m["zones_lost"]["tj-thermal"] == 0
    assert 'edgeattn_thermal_zone_lost{zone="tj-thermal"} 0.0' in _scrape(c)


def test_a_zone_that_never_read_is_not_counted_as_hot(tmp_path):
    """Only a zone that was read before counts as lost: an absent block (never read) is left out."""
    c, thermal, clock = _controller(tmp_path, {"cpu-thermal": "60000\n", "gpu-thermal": "62000\n",
                                               "tj-thermal": "-256000\n"})
    assert _run(c, clock, 10)[-1] == 0
    assert c.metrics_snapshot()["zones_lost"] == {"cpu-thermal": 0, "gpu-thermal": 0}


def _fault_series(text: str) -> set[tuple[str, ...]]:
    """Label sets of every fault series, from both collectors."""
    found = set()
    for line in text.splitlines():
        if line.startswith(("edgeattn_thermal_sensor_faults_total{", "edgeattn_device_sensor_fault_counts{")):
            found.add((line.split("{")[0],) + tuple(sorted(re.findall(r'(\w+)="([^"]*)"', line))))
    return found


def test_fault_labels_take_fixed_values_and_the_detail_goes_to_the_log(tmp_path, caplog):
    c, thermal, clock = _controller(tmp_path, {"cpu-thermal": "60000\n", "gpu-thermal": "60000\n",
                                               "tj-thermal": "61000\n"}, FaultConfig(stuck_s=10.0))
    with caplog.at_level("WARNING", logger="edgeattn.thermal"):
        for i in range(120):  # gpu-thermal repeats 60.0 C with no power known: stuck after 40 s
            set_temp(thermal, 0, f"{60000 + 100 * (i % 7)}\n")
            set_temp(thermal, 2, f"hot{'!' * (1 + i % 3)}\n")  # a different unparsable text each sample
            _run(c, clock, 1.0)
    series = _fault_series(_scrape(c))
    assert series == {
        ("edgeattn_thermal_sensor_faults_total", ("kind", "stuck"), ("zone", "gpu-thermal")),
        ("edgeattn_thermal_sensor_faults_total", ("kind", "unparsable"), ("zone", "tj-thermal")),
        ("edgeattn_device_sensor_fault_counts", ("sensor", "gpu-thermal:stuck")),
        ("edgeattn_device_sensor_fault_counts", ("sensor", "tj-thermal:unparsable")),
    }
    counts = c.metrics_snapshot()["sensor_fault_counts"]
    assert counts["tj-thermal:unparsable"] == 240 and 150 < counts["gpu-thermal:stuck"] < 170
    assert any("gpu-thermal: stuck at 60.0 C for" in m for m in caplog.messages)
    assert any("tj-thermal: unparsable read 'hot!!!'" in m for m in caplog.messages)
