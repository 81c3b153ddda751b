"""Sensor fault detection, shared by every sensor: one `ZoneGuard` per temperature zone.

Faults: the zone is missing, a read fails, the value is empty, zero (block powered off), the -256 C
"invalid" code, outside a physical range, or stuck: the same value for `stuck_s` while the power moved
by `stuck_power_frac` of its peak (a healthy sensor follows a power change; at steady load an integer
sensor legitimately repeats), or for 4 x `stuck_s` when no power is known. A faulted zone keeps its
last good value for `stale_s` seconds (so a hot zone that drops out does not make the device look
cooler), then it is left out; when no zone is valid the reading has `temp_c = None`, which every
policy treats as "assume hot" (the smallest window).
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

    def __post_init__(self) -> None:
        if not self.min_c < self.max_c:
            raise ConfigError(f"fault range: expected min_c < max_c, found {self.min_c} >= {self.max_c}")
        if self.stuck_s <= 0 or not 0 < self.stuck_power_frac <= 1:
            raise ConfigError(f"stuck: expected stuck_s > 0 and 0 < stuck_power_frac <= 1, found {self.stuck_s}, "
                              f"{self.stuck_power_frac}")
        if self.stale_s < 0:
            raise ConfigError(f"stale_s: expected >= 0, found {self.stale_s}")


DEFAULT_FAULTS = FaultConfig()


class ZoneGuard:
    """Checks one zone's raw values; `check` returns (value to use or None, fault text or None)."""

    def __init__(self, name: str, config: FaultConfig = DEFAULT_FAULTS) -> None:
        self.name = name
        self.config = config
        self._run: tuple[float, float] | None = None  # (value, since t) of the current run of equal values
        self._run_power: list[float] = []  # min, max power during the run
        self._good: tuple[float, float] | None = None  # (t, value)

    def check(self, raw: object, t: float, power_w: float | None = None) -> tuple[float | None, str | None]:
        """`raw`: a number, a string from sysfs, None (zone missing) or an exception (read error)."""
        fault = self._classify(raw, t, power_w)
        if fault is None:
            value = float(raw)  # type: ignore[arg-type]
            self._good = (t, value)
            return value, None
        if self._good is not None and t - self._good[0] <= self.config.stale_s:
            return self._good[1], f"{self.name}: {fault} (holding {self._good[1]:.1f} C)"
        return None, f"{self.name}: {fault}"

    def _classify(self, raw: object, t: float, power_w: float | None) -> str | None:
        if raw is None:
            return "missing"
        if isinstance(raw, BaseException):
            return f"read error ({type(raw).__name__}: {raw})"
        if isinstance(raw, str):
            if not raw.strip():
                return "empty read"
            try:
                raw = float(raw)
            except ValueError:
                return f"unparsable read {raw.strip()!r}"
        value = float(raw)  # type: ignore[arg-type]
        stuck = self._stuck_for(value, t, power_w)
        if value == INVALID_C:
            return "invalid -256 C"
        if value == 0.0:
            return "zero read (block powered off?)"
        if not self.config.min_c <= value <= self.config.max_c:
            return f"out of range {value:.1f} C"
        if stuck:
            return f"stuck at {value:.1f} C for {stuck:.0f} s"
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
