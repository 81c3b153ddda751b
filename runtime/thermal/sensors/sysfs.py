"""Jetson sensors from sysfs: thermal zones (millidegrees C) and INA3221 power rails (mV, mA).

Trip points are read at run time from each zone's trip_point_*_{type,temp}: the throttle point is the
lowest "passive" trip (Orin: software throttle 99.0 C), else the lowest "hot"/"critical" one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from edgeattn.errors import InputError
from edgeattn.runtime.thermal.faults import DEFAULT_FAULTS, FaultConfig, ZoneGuard
from edgeattn.runtime.thermal.readings import Reading

THERMAL_ROOT = Path("/sys/devices/virtual/thermal")
HWMON_ROOT = Path("/sys/class/hwmon")
TOTAL_RAILS = ("VDD_IN", "POM_5V_IN")  # rails that already hold the whole module's input power


def _read_text(path: Path) -> object:
    """The file's text, None when it does not exist, the exception when the read fails."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc


def _milli(raw: object) -> object:
    if isinstance(raw, str) and raw.strip():
        try:
            return int(raw.strip()) / 1000.0
        except ValueError:
            return raw
    return raw


class SysfsSensor:
    def __init__(self, root: Path = THERMAL_ROOT, hwmon_root: Path = HWMON_ROOT, zones: Sequence[str] | None = None,
                 faults: FaultConfig = DEFAULT_FAULTS, clock: Callable[[], float] = time.monotonic) -> None:
        self.root, self.hwmon_root, self.clock = Path(root), Path(hwmon_root), clock
        found: dict[str, Path] = {}
        for d in sorted(self.root.glob("thermal_zone*")):
            kind = _read_text(d / "type")
            found[kind.strip() if isinstance(kind, str) and kind.strip() else d.name] = d
        if not found:
            raise InputError(f"no thermal zones under {self.root}: expected thermal_zone*/type and temp (is this a Jetson?)")
        names = list(zones) if zones else sorted(found)
        self._dirs = {name: found.get(name) for name in names}  # a requested zone that is absent reads as missing
        self._guards = {name: ZoneGuard(name, faults) for name in names}
        self.trip_c = self._trip_point()
        self._rails = self._find_rails()

    def _trip_point(self) -> float | None:
        by_type: dict[str, list[float]] = {}
        for d in self._dirs.values():
            if d is None:
                continue
            for type_file in d.glob("trip_point_*_type"):
                temp = _milli(_read_text(type_file.with_name(type_file.name.replace("_type", "_temp"))))
                kind = _read_text(type_file)
                if isinstance(temp, float) and temp > 0 and isinstance(kind, str):
                    by_type.setdefault(kind.strip(), []).append(temp)
        for kind in ("passive", "hot", "critical"):
            if by_type.get(kind):
                return min(by_type[kind])
        return None

    def _find_rails(self) -> list[tuple[str, Path, Path]]:
        rails = []
        for hw in sorted(self.hwmon_root.glob("hwmon*")):
            if (_read_text(hw / "name") or "").strip() != "ina3221":  # type: ignore[union-attr]
                continue
            for volt in sorted(hw.glob("in*_input")):
                n = volt.name[2:-6]
                label = _read_text(hw / f"in{n}_label")
                curr = hw / f"curr{n}_input"
                if isinstance(label, str) and curr.exists():
                    rails.append((label.strip(), volt, curr))
        totals = [r for r in rails if r[0] in TOTAL_RAILS]
        return totals[:1] or rails

    def _power(self) -> float | None:
        total = 0.0
        for _, volt, curr in self._rails:
            v, i = _read_text(volt), _read_text(curr)
            try:
                total += int(v) * int(i) / 1e6  # type: ignore[arg-type]  # mV * mA -> W
            except (TypeError, ValueError):
                return None
        return total if self._rails else None

    def read(self) -> Reading:
        t = self.clock()
        power = self._power()
        temps, faults = {}, []
        for name, d in self._dirs.items():
            raw = _milli(_read_text(d / "temp")) if d is not None else None
            value, fault = self._guards[name].check(raw, t, power)
            if value is not None:
                temps[name] = value
            if fault:
                faults.append(fault)
        lost = tuple(name for name, guard in self._guards.items() if guard.lost)
        return Reading(t=t, temps=temps, power_w=power, trip_c=self.trip_c, faults=tuple(faults), lost=lost,
                       throttle=self.trip_c is not None and bool(temps) and max(temps.values()) >= self.trip_c)

    def close(self) -> None:
        pass
