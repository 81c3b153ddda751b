"""Sensor fault detection, shared by every sensor: one `ZoneGuard` per temperature zone.

Faults: the zone is missing, a read fails, the value is empty, zero (block powered off), the -256 C
"invalid" code, outside a physical range, or stuck: the same value for `stuck_s` while the power moved
by `stuck_power_frac` of its peak (a healthy sensor follows a power change; at steady load an integer
sensor legitimately repeats), or for 4 x `stuck_s` when no power is known. Each fault has a fixed `kind`
(for metric labels) and a free-text `detail` (for the log).

A faulted zone keeps its last good value for `stale_s` seconds. After that a zone that had been read is
*lost*: its temperature is unknown, so it counts as hot (the reading's `temp_c` is None, which every policy
treats as "assume hot", the smallest window) until it has read normally for `recover_s` seconds in a row.
A zone that never read (a block that is absent or powered off from the start) is only left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeattn.errors import ConfigError

INVALID_C = -256.0  # what Jetson firmware reports for a zone it cannot read


@dataclass(frozen=True)
class FaultConfig:
    min_c: float = -40.0
    max_c: float = 150.0
    stuck_s: float = 120.0
    stuck_power_frac: float = 0.25
    stale_s: float = 5.0
    recover_s: float = 30.0  # normal reads in a row before a lost zone is trusted again

    def __post_init__(self) -> None:
        if not self.min_c < self.max_c:
            raise ConfigError(f"fault range: expected min_c < max_c, found {self.min_c} >= {self.max_c}")
        if self.stuck_s <= 0 or not 0 < self.stuck_power_frac <= 1:
            raise ConfigError(f"stuck: expected stuck_s > 0 and 0 < stuck_power_frac <= 1, found {self.stuck_s}, "
                              f"{self.stuck_power_frac}")
        if self.stale_s < 0 or self.recover_s < 0:
            raise ConfigError(f"stale_s and recover_s: expected >= 0 seconds, found {self.stale_s}, {self.recover_s}")


DEFAULT_FAULTS = FaultConfig()

FAULT_KINDS = ("missing", "read_error", "empty", "unparsable", "invalid", "zero", "out_of_range", "stuck")


@dataclass(frozen=True)
class Fault:
    """One zone's fault in one sample. `zone` and `kind` (one of FAULT_KINDS) are fixed values, fit for
    metric labels; `detail` carries the value, the raw text or the duration, for the log."""

    zone: str
    kind: str
    detail: str
    holding_c: float | None = None  # the last good value still used for the zone

    def __str__(self) -> str:
        held = "" if self.holding_c is None else f" (holding {self.holding_c:.1f} C)"
        return f"{self.zone}: {self.detail}{held}"


class ZoneGuard:
    """Checks one zone's raw values; `check` returns (value to use or None, Fault or None). `lost` is True
    while the zone counts as hot: read before, then faulted for more than `stale_s`, and not yet back for
    `recover_s`."""

    def __init__(self, name: str, config: FaultConfig = DEFAULT_FAULTS) -> None:
        self.name = name
        self.config = config
        self._run: tuple[float, float] | None = None  # (value, since t) of the current run of equal values
        self._run_power: list[float] = []  # min, max power during the run
        self._good: tuple[float, float] | None = None  # (t, value)
        self._lost = False
        self._normal_since: float | None = None  # start of the current run of normal reads

    @property
    def lost(self) -> bool:
        return self._lost

    def check(self, raw: object, t: float, power_w: float | None = None) -> tuple[float | None, Fault | None]:
        """`raw`: a number, a string from sysfs, None (zone missing) or an exception (read error)."""
        found = self._classify(raw, t, power_w)
        if found is None:
            value = float(raw)  # type: ignore[arg-type]
            self._normal_since = t if self._normal_since is None else self._normal_since
            if self._lost and t - self._normal_since >= self.config.recover_s:
                self._lost = False
            self._good = (t, value)
            return value, None
        self._normal_since = None
        kind, detail = found
        if self._good is not None and t - self._good[0] <= self.config.stale_s:
            return self._good[1], Fault(self.name, kind, detail, self._good[1])
        self._lost = self._good is not None
        return None, Fault(self.name, kind, detail)

    def _classify(self, raw: object, t: float, power_w: float | None) -> tuple[str, str] | None:
        if raw is None:
            return "missing", "missing"
        if isinstance(raw, BaseException):
            return "read_error", f"read error ({type(raw).__name__}: {raw})"
        if isinstance(raw, str):
            if not raw.strip():
                return "empty", "empty read"
            try:
                raw = float(raw)
            except ValueError:
                return "unparsable", f"unparsable read {raw.strip()!r}"
        value = float(raw)  # type: ignore[arg-type]
        stuck = self._stuck_for(value, t, power_w)
        if value == INVALID_C:
            return "invalid", "invalid -256 C"
        if value == 0.0:
            return "zero", "zero read (block powered off?)"
        if not self.config.min_c <= value <= self.config.max_c:
            return "out_of_range", f"out of range {value:.1f} C"
        if stuck:
            return "stuck", f"stuck at {value:.1f} C for {stuck:.0f} s"
        return None

    def _stuck_for(self, value: float, t: float, power_w: float | None) -> float:
        """Seconds the value has been stuck (0 when it is not)."""
        if self._run is None or self._run[0] != value:
            self._run, self._run_power = (value, t), []
        if power_w is not None:
            self._run_power = [min(self._run_power[0], power_w), max(self._run_power[1], power_w)] \
                if self._run_power else [power_w, power_w]
        held = t - self._run[1]
        if self._run_power:
            low, high = self._run_power
            moved = high > 0 and high - low >= self.config.stuck_power_frac * high
            return held if moved and held >= self.config.stuck_s else 0.0
        return held if held >= 4 * self.config.stuck_s else 0.0
