"""Fakes for the thermal tests: a Jetson-like sysfs tree and a pynvml module."""

from __future__ import annotations

import types
from pathlib import Path


def jetson_tree(root: Path, zones: dict[str, str], trips: dict[str, list[tuple[str, int]]] | None = None,
                rails: dict[str, tuple[int, int]] | None = None) -> tuple[Path, Path]:
    """thermal_zone*/{type,temp,trip_point_*}, hwmon*/ (ina3221: in*_label, in*_input mV, curr*_input mA)."""
    thermal, hwmon = root / "thermal", root / "hwmon"
    for i, (name, temp) in enumerate(zones.items()):
        d = thermal / f"thermal_zone{i}"
        d.mkdir(parents=True)
        (d / "type").write_text(name + "\n")
        (d / "temp").write_text(temp)
        for k, (kind, milli) in enumerate((trips or {}).get(name, [])):
            (d / f"trip_point_{k}_type").write_text(kind + "\n")
            (d / f"trip_point_{k}_temp").write_text(f"{milli}\n")
    hw = hwmon / "hwmon0"
    hw.mkdir(parents=True)
    (hw / "name").write_text("ina3221\n")
    for n, (label, (mv, ma)) in enumerate((rails or {}).items(), start=1):
        (hw / f"in{n}_label").write_text(label + "\n")
        (hw / f"in{n}_input").write_text(f"{mv}\n")
        (hw / f"curr{n}_input").write_text(f"{ma}\n")
    return thermal, hwmon


def set_temp(thermal: Path, zone_index: int, text: str) -> None:
    (thermal / f"thermal_zone{zone_index}" / "temp").write_text(text)


class FakeNvmlError(Exception):
    pass


def fake_pynvml(temps: list, power_mw: float = 250_000.0, reasons: int = 0, slowdown: int = 87):
    """A pynvml stand-in; `temps` is consumed one value per read (an Exception instance is raised)."""
    state = {"temps": list(temps), "power": power_mw, "reasons": reasons, "init": 0, "shutdown": 0}

    def get_temperature(handle, sensor):
        value = state["temps"].pop(0) if len(state["temps"]) > 1 else state["temps"][0]
        if isinstance(value, Exception):
            raise value
        return value

    mod = types.SimpleNamespace(
        NVMLError=FakeNvmlError, NVML_TEMPERATURE_GPU=0, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN=1, NVML_CLOCK_SM=1,
        nvmlInit=lambda: state.__setitem__("init", state["init"] + 1),
        nvmlShutdown=lambda: state.__setitem__("shutdown", state["shutdown"] + 1),
        nvmlDeviceGetHandleByIndex=lambda i: ("gpu", i),
        nvmlDeviceGetTemperature=get_temperature,
        nvmlDeviceGetTemperatureThreshold=lambda h, kind: slowdown,
        nvmlDeviceGetPowerUsage=lambda h: state["power"],
        nvmlDeviceGetClockInfo=lambda h, kind: 1980,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: state["reasons"],
    )
    mod.state = state
    return mod
