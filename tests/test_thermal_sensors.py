"""Sensors: Jetson sysfs (zones, trip points, INA3221), NVML (fake module), replay, and every fault kind."""

from __future__ import annotations

import pytest

from edgeattn.errors import InputError
from edgeattn.runtime.thermal.faults import FaultConfig, ZoneGuard
from edgeattn.runtime.thermal.policies import StepPolicy, PolicyState, PredictivePolicy
from edgeattn.runtime.thermal.sensors.nvml import NvmlSensor
from edgeattn.runtime.thermal.sensors.replay import ReplaySensor
from edgeattn.runtime.thermal.sensors.sysfs import SysfsSensor
from thermal_fakes import fake_pynvml, jetson_tree, set_temp


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


ORIN_TRIPS = {"cpu-thermal": [("passive", 99000), ("critical", 104500)], "gpu-thermal": [("passive", 99000)]}


@pytest.fixture
def orin(tmp_path):
    thermal, hwmon = jetson_tree(tmp_path, {"cpu-thermal": "61500\n", "gpu-thermal": "64250\n", "tj-thermal": "65000\n"},
                                 ORIN_TRIPS, {"VDD_IN": (5000, 3000), "VDD_CPU_GPU_CV": (5000, 1000)})
    return thermal, hwmon


def test_sysfs_reads_zones_trip_point_and_total_rail(orin):
    thermal, hwmon = orin
    r = SysfsSensor(thermal, hwmon).read()
    assert r.temps == {"cpu-thermal": 61.5, "gpu-thermal": 64.25, "tj-thermal": 65.0}
    assert r.temp_c == 65.0 and r.trip_c == 99.0 and r.faults == () and not r.throttle
    assert r.power_w == pytest.approx(15.0)  # VDD_IN only: 5000 mV * 3000 mA, the other rail is inside it


def test_sysfs_without_zones_says_what_it_expected(tmp_path):
    with pytest.raises(InputError, match="thermal_zone"):
        SysfsSensor(tmp_path / "none", tmp_path)


@pytest.mark.parametrize("text, fault", [("-256000\n", "invalid -256 C"), ("\n", "empty read"),
                                         ("0\n", "zero read"), ("999000\n", "out of range")])
def test_sysfs_bad_values_are_faults_and_the_zone_is_dropped(orin, text, fault):
    thermal, hwmon = orin
    clock = Clock()
    sensor = SysfsSensor(thermal, hwmon, faults=FaultConfig(stale_s=0.0), clock=clock)
    set_temp(thermal, 2, text)  # tj-thermal, the hottest zone
    clock.t = 1.0
    r = sensor.read()
    assert "tj-thermal" not in r.temps and r.temp_c == 64.25
    assert len(r.faults) == 1 and str(r.faults[0]).startswith("tj-thermal: " + fault) and r.lost == ()


def test_faulted_hot_zone_holds_its_last_value_then_counts_as_hot(orin):
    thermal, hwmon = orin
    clock = Clock()
    sensor = SysfsSensor(thermal, hwmon, faults=FaultConfig(stale_s=5.0, recover_s=20.0), clock=clock)
    sensor.read()
    set_temp(thermal, 2, "-256000\n")
    clock.t = 2.0
    held = sensor.read()
    assert held.temp_c == 65.0 and "holding 65.0 C" in str(held.faults[0])  # safe side: not cooler than it was
    assert held.faults[0].kind == "invalid" and held.lost == ()
    clock.t = 10.0
    lost = sensor.read()  # not the cooler zones' 64.25 C: unknown, and every policy assumes hot
    assert lost.temp_c is None and lost.lost == ("tj-thermal",)
    assert lost.temps == {"cpu-thermal": 61.5, "gpu-thermal": 64.25}
    set_temp(thermal, 2, "63000\n")
    for t, still_lost in ((11.0, True), (30.0, True), (31.0, False)):  # 20 s of normal reads from t = 11
        clock.t = t
        r = sensor.read()
        assert (r.lost == ("tj-thermal",)) is still_lost and r.temps["tj-thermal"] == 63.0
    assert r.temp_c == 64.25


def test_missing_zone_and_read_error(orin):
    thermal, hwmon = orin
    sensor = SysfsSensor(thermal, hwmon, zones=["cpu-thermal", "soc9-thermal"], faults=FaultConfig(stale_s=0.0))
    r = sensor.read()
    assert tuple(map(str, r.faults)) == ("soc9-thermal: missing",) and r.temp_c == 61.5 and r.lost == ()
    (thermal / "thermal_zone0" / "temp").unlink()
    (thermal / "thermal_zone0" / "temp").mkdir()  # reading a directory raises IsADirectoryError
    r = sensor.read()
    assert r.temp_c is None and any("read error (IsADirectoryError" in str(f) for f in r.faults)


def _text(fault) -> str | None:
    return None if fault is None else str(fault)


def test_stuck_zone_is_detected_when_power_moves_but_the_value_does_not():
    guard = ZoneGuard("gpu", FaultConfig(stuck_s=60.0))
    steady = [_text(guard.check("70.5", float(t), 300.0)[1]) for t in range(0, 400, 10)]
    assert steady == [None] * 40  # steady load: an integer sensor may repeat for minutes
    guard = ZoneGuard("gpu", FaultConfig(stuck_s=60.0))
    faults = [_text(guard.check("70.5", float(t), 300.0 if t < 30 else 100.0)[1]) for t in range(0, 90, 10)]
    assert faults[:6] == [None] * 6 and faults[6] == "gpu: stuck at 70.5 C for 60 s"  # 300 -> 100 W, no change
    assert guard.check("70.6", 90.0, 100.0) == (70.6, None)
    no_power = ZoneGuard("gpu", FaultConfig(stuck_s=60.0))
    faults = [_text(no_power.check("70.5", float(t))[1]) for t in (0, 200, 240)]
    assert faults[:2] == [None, None] and faults[2] == "gpu: stuck at 70.5 C for 240 s"


def test_no_valid_temperature_sends_every_policy_to_the_smallest_window(orin):
    thermal, hwmon = orin
    sensor = SysfsSensor(thermal, hwmon, faults=FaultConfig(stale_s=0.0))
    for i in range(3):
        set_temp(thermal, i, "-256000\n")
    r = sensor.read()
    assert r.temp_c is None and len(r.faults) == 3
    for policy in (StepPolicy(), PredictivePolicy(r_c_per_w=2.0, tau_s=100.0)):
        d = policy.decide(r, PolicyState())
        assert d.fraction == policy.levels[-1] and "assuming hot" in d.reason


def test_nvml_reads_temperature_power_clock_and_thermal_throttle():
    nvml = fake_pynvml([71], power_mw=312_500, reasons=0x20)
    sensor = NvmlSensor(0, nvml=nvml)
    r = sensor.read()
    assert r.temps == {"gpu0": 71.0} and r.power_w == 312.5 and r.clock_mhz == 1980
    assert r.throttle and r.trip_c == 87.0
    nvml.state["reasons"] = 0x4  # power cap: not thermal
    assert not sensor.read().throttle
    sensor.close()
    assert nvml.state["shutdown"] == 1


def test_nvml_read_error_is_a_fault():
    nvml = fake_pynvml([70, RuntimeError("x")])
    nvml.state["temps"][1] = nvml.NVMLError("GPU is lost")
    sensor = NvmlSensor(0, nvml=nvml, faults=FaultConfig(stale_s=0.0))
    assert sensor.read().temp_c == 70.0
    r = sensor.read()
    assert r.temp_c is None and tuple(map(str, r.faults)) == ("gpu0: read error (FakeNvmlError: GPU is lost)",)
    assert r.faults[0].kind == "read_error" and r.lost == ("gpu0",)


def test_nvml_missing_module_gives_install_hint(monkeypatch):
    import sys

    from edgeattn.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with pytest.raises(MissingDependencyError, match="nvidia-ml-py"):
        NvmlSensor(0)


def test_replay_follows_the_clock(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("t,temp_c,power_w,throttle\n0,50,10,0\n1,60,20,0\n2,,20,0\n3,99.5,30,1\n")
    clock = Clock()
    sensor = ReplaySensor(path, clock=clock, trip_c=99.0, faults=FaultConfig(stale_s=0.0, recover_s=0.0))
    got = []
    for t in (0.0, 1.5, 2.2, 3.0, 9.0):
        clock.t = t
        r = sensor.read()
        got.append((r.temp_c, r.power_w, r.throttle, bool(r.faults)))
    assert got == [(50.0, 10.0, False, False), (60.0, 20.0, False, False), (None, 20.0, False, True),
                   (99.5, 30.0, True, False), (99.5, 30.0, True, False)]


def test_open_sensor_by_name(tmp_path, monkeypatch):
    import sys

    from edgeattn.errors import ConfigError
    from edgeattn.runtime.thermal.sensors import open_sensor

    (tmp_path / "t.csv").write_text("t,temp_c,power_w\n0,50,10\n")
    assert isinstance(open_sensor(f"replay:{tmp_path / 't.csv'}"), ReplaySensor)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([50]))
    assert isinstance(open_sensor("nvml"), NvmlSensor)
    with pytest.raises(ConfigError, match="expected auto, sysfs, nvml"):
        open_sensor("ipmi")
