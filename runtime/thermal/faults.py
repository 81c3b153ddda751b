"""Sensor fault detection, shared by every sensor: one `ZoneGuard` per temperature zone.

Faults: the zone is missing, a read fails, the value is empty, zero (block powered off), the -256 C
"invalid" code, outside a physical range, or stuck at one value for too long. A faulted zone keeps its
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
    stuck_reads: int = 120  # identical raw values in a row (60 s at 2 Hz) before a zone counts as stuck
    stale_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.min_c < self.max_c:
            raise ConfigError(f"fault range: expected min_c < max_c, found {self.min_c} >= {self.max_c}")
        if self.stuck_reads < 2:
            raise ConfigError(f"stuck_reads: expected >= 2, found {self.stuck_reads}")
        if self.stale_s < 0:
            raise ConfigError(f"stale_s: expected >= 0, found {self.stale_s}")


DEFAULT_FAULTS = FaultConfig()


class ZoneGuard:
    """Checks one zone's raw values; `check` returns (value to use or None, fault text or None)."""

    def __init__(self, name: str, config: FaultConfig = DEFAULT_FAULTS) -> None:
        self.name = name
        self.config = config
        self._last_raw: object = None
        self._repeats = 0
        self._good: tuple[float, float] | None = None  # (t, value)

    def check(self, raw: object, t: float) -> tuple[float | None, str | None]:
        """`raw`: a number, a string from sysfs, None (zone missing) or an exception (read error)."""
        fault = self._classify(raw)
        if fault is None:
            value = float(raw)  # type: ignore[arg-type]
            self._good = (t, value)
            return value, None
        if self._good is not None and t - self._good[0] <= self.config.stale_s:
            return self._good[1], f"{self.name}: {fault} (holding {self._good[1]:.1f} C)"
        return None, f"{self.name}: {fault}"

    def _classify(self, raw: object) -> str | None:
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
        stuck = self._count_repeats(value)
        if value == INVALID_C:
            return "invalid -256 C"
        if value == 0.0:
            return "zero read (block powered off?)"
        if not self.config.min_c <= value <= self.config.max_c:
            return f"out of range {value:.1f} C"
        if stuck:
            return f"stuck at {value:.1f} C for {self._repeats} reads"
        return None

    def _count_repeats(self, value: float) -> bool:
        self._repeats = self._repeats + 1 if value == self._last_raw else 1
        self._last_raw = value
        return self._repeats >= self.config.stuck_reads
