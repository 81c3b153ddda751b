"""What a sensor returns, and the protocol every sensor follows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from edgeattn.runtime.thermal.faults import Fault


@dataclass(frozen=True)
class Reading:
    """One sample. Temperatures in C, power in W, clocks in MHz; None where the sensor has no value.

    `temps` holds only zones that passed the fault checks; `faults` names the ones that did not
    (`str(fault)`: "gpu-thermal: invalid -256 C"). `lost` names zones that were read before and are faulted
    now, or not yet trusted again: their real temperature is unknown, so they count as hot. `temp_c` is the
    hottest valid zone; None when none is valid or a zone is lost (every policy then assumes hot).
    """

    t: float
    temps: dict[str, float] = field(default_factory=dict)
    power_w: float | None = None
    clock_mhz: float | None = None
    throttle: bool = False
    trip_c: float | None = None
    faults: tuple[Fault, ...] = ()
    lost: tuple[str, ...] = ()

    @property
    def temp_c(self) -> float | None:
        return max(self.temps.values()) if self.temps and not self.lost else None


@runtime_checkable
class Sensor(Protocol):
    """Anything with `read() -> Reading`, a `trip_c` (the throttle point, None if unknown) and `close()`."""

    trip_c: float | None

    def read(self) -> Reading: ...

    def close(self) -> None: ...
