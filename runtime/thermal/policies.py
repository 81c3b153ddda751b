"""Window policies: pure functions of (reading, state) -> Decision. Sinks are never touched here.

Levels are fractions of the model's max window, largest first (1.0 = full). A level is an attention budget:
`budget` (a `BudgetSplit`) says how its rows are split between the recent window and retrieval pages; the
default, recent = 1.0, gives them all to the window (the window policies as they always were). Both policies go to the
smallest level at once when the temperature is unknown (every zone faulted, or a zone that had been read is
lost) or at the trip point, shrink
the window without delay, and grow it only after `min_hold_s` at the current level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from edgeattn.attention.budget import DEFAULT_PAGE
from edgeattn.errors import ConfigError
from edgeattn.runtime.thermal.readings import Reading


@dataclass(frozen=True)
class PolicyState:
    level: int = 0  # index into levels
    changed_t: float = -math.inf
    integral_c: float = 0.0  # predictive: setpoint lowering from the integral term
    temp_hat_c: float | None = None  # predictive: observer state
    ambient_hat_c: float | None = None
    last_t: float | None = None
    last_power_w: float | None = None


@dataclass(frozen=True)
class Decision:
    fraction: float
    state: PolicyState
    reason: str = ""  # non-empty when the level changed
    time_to_trip_s: float | None = None  # predictive only; None = not heading for the trip point


@dataclass(frozen=True)
class BudgetSplit:
    """How a level's rows are split: a `recent` share to the recent window, the rest to retrieval pages of
    `page` rows (edgeattn/attention/budget.py). recent = 1.0: the window alone."""

    recent: float = 1.0
    page: int = DEFAULT_PAGE

    def __post_init__(self) -> None:
        if not _is_number(self.recent) or not 0.0 <= self.recent <= 1.0:
            raise ConfigError(f"budget.recent: expected a fraction from 0 to 1 (1 = the window alone), "
                              f"found {self.recent!r}")
        if isinstance(self.page, bool) or not isinstance(self.page, int) or self.page < 1:
            raise ConfigError(f"budget.page: expected a positive integer (rows per page), found {self.page!r}")

    @property
    def window_only(self) -> bool:
        return self.recent >= 1.0


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_types(policy) -> None:
    """Every field a finite number, `levels` and `thresholds_c` sequences of them (policy files give any type)."""
    for f in fields(policy):
        value = getattr(policy, f.name)
        if f.name == "budget":
            if not isinstance(value, BudgetSplit):
                raise ConfigError(f"budget: expected a split such as {{recent = 0.25}}, found {value!r}")
        elif f.name in ("levels", "thresholds_c"):
            if not isinstance(value, (tuple, list)) or not all(_is_number(v) for v in value):
                shown = list(value) if isinstance(value, tuple) else value
                raise ConfigError(f"{f.name}: expected a list of numbers, found {shown!r}")
        elif not _is_number(value):
            raise ConfigError(f"{f.name}: expected a number, found {value!r}")


def _check_levels(levels: tuple[float, ...]) -> None:
    if not levels or any(not 0 < f <= 1 for f in levels) or list(levels) != sorted(set(levels), reverse=True):
        raise ConfigError(f"levels: expected distinct fractions in (0, 1], largest first, found {list(levels)}")


def _move(state: PolicyState, level: int, t: float, reason: str, levels: tuple[float, ...]) -> tuple[PolicyState, str]:
    if level == state.level:
        return state, ""
    return replace(state, level=level, changed_t=t), f"{levels[state.level]:g} -> {levels[level]:g}: {reason}"


def _safety(reading: Reading, emergency_c: float) -> str:
    if reading.lost:
        return f"lost zone(s) {', '.join(reading.lost)}: read before, temperature unknown now, assuming hot"
    if reading.temp_c is None:
        return "no valid temperature (" + ("; ".join(map(str, reading.faults)) or "no zones") + "), assuming hot"
    if reading.trip_c is not None and reading.temp_c >= reading.trip_c - emergency_c:
        return f"{reading.temp_c:.1f} C at the trip point {reading.trip_c:.1f} C (-{emergency_c:g})"
    return ""


@dataclass(frozen=True)
class StepPolicy:
    """Threshold i (ascending) moves to level i+1; down again below threshold - hysteresis."""

    levels: tuple[float, ...] = (1.0, 0.5, 0.25)
    thresholds_c: tuple[float, ...] = (75.0, 85.0)
    hysteresis_c: float = 3.0
    min_hold_s: float = 10.0
    budget: BudgetSplit = BudgetSplit()
    kind = "step"

    def __post_init__(self) -> None:
        _check_types(self)
        _check_levels(self.levels)
        if len(self.thresholds_c) != len(self.levels) - 1 or list(self.thresholds_c) != sorted(self.thresholds_c):
            raise ConfigError(f"thresholds_c: expected {len(self.levels) - 1} ascending values (one per level after "
                              f"the first), found {list(self.thresholds_c)}")
        if self.hysteresis_c < 0 or self.min_hold_s < 0:
            raise ConfigError("hysteresis_c and min_hold_s: expected >= 0")

    def decide(self, reading: Reading, state: PolicyState) -> Decision:
        t, temp = reading.t, reading.temp_c
        unsafe = _safety(reading, 0.0)
        if unsafe:
            new, reason = _move(state, len(self.levels) - 1, t, unsafe, self.levels)
            return Decision(self.levels[new.level], new, reason)
        hot = sum(temp >= th for th in self.thresholds_c)
        cool = sum(temp >= th - self.hysteresis_c for th in self.thresholds_c)
        new, reason = state, ""
        if hot > state.level:
            new, reason = _move(state, hot, t, f"{temp:.1f} C >= {self.thresholds_c[hot - 1]:g} C", self.levels)
        elif cool < state.level and t - state.changed_t >= self.min_hold_s:
            new, reason = _move(state, cool, t, f"{temp:.1f} C < {self.thresholds_c[cool]:g} - "
                                f"{self.hysteresis_c:g} C", self.levels)
        return Decision(self.levels[new.level], new, reason)


@dataclass(frozen=True)
class PredictivePolicy:
    """Model-based: the largest level whose predicted temperature `horizon_s` ahead stays below the setpoint.

    An observer tracks the temperature and the ambient (the fitted ambient is only a start value).
    The power at another level is scaled from the measured power: idle + dynamic * (1 - s + s f) /
    (1 - s + s f_now), s = `attention_share`. An integral term lowers the setpoint while the temperature
    sits above it (PI-like), clamped to `integral_max_c` and frozen at the smallest level (anti-windup).
    """

    r_c_per_w: float
    tau_s: float
    ambient_c: float = 25.0
    levels: tuple[float, ...] = (1.0, 0.75, 0.5, 0.375, 0.25)
    margin_c: float = 6.0  # setpoint = trip - margin
    horizon_s: float = 60.0
    up_margin_c: float = 2.0  # extra room needed to grow the window
    min_hold_s: float = 30.0
    ki: float = 0.02  # C of setpoint lowering per C*s above the setpoint
    integral_max_c: float = 5.0
    emergency_c: float = 1.0
    idle_w: float = 5.0
    attention_share: float = 0.6
    observer_gain: float = 0.3
    ambient_gain: float = 0.02
    default_trip_c: float = 99.0  # when the sensor reports none
    budget: BudgetSplit = BudgetSplit()
    kind = "predictive"

    def __post_init__(self) -> None:
        _check_types(self)
        _check_levels(self.levels)
        if not (self.r_c_per_w > 0 and self.tau_s > 0 and self.horizon_s > 0):
            raise ConfigError("predictive policy: expected r_c_per_w, tau_s and horizon_s > 0")
        if min(self.margin_c, self.up_margin_c, self.min_hold_s, self.ki, self.integral_max_c, self.emergency_c) < 0:
            raise ConfigError("predictive policy: margins, min_hold_s, ki, integral_max_c, emergency_c must be >= 0")
        if not (0 <= self.attention_share <= 1 and 0 < self.observer_gain <= 1 and 0 <= self.ambient_gain <= 1):
            raise ConfigError("predictive policy: expected attention_share in [0,1], gains in (0,1]")

    def _observe(self, reading: Reading, state: PolicyState, power: float) -> tuple[float, float]:
        temp = reading.temp_c
        if state.temp_hat_c is None or state.last_t is None:
            return temp, temp - self.r_c_per_w * power  # start as if in steady state
        dt = max(reading.t - state.last_t, 0.0)
        p = state.last_power_w if state.last_power_w is not None else power
        steady = state.ambient_hat_c + self.r_c_per_w * p
        pred = steady + (state.temp_hat_c - steady) * math.exp(-dt / self.tau_s)
        err = temp - pred
        return pred + self.observer_gain * err, state.ambient_hat_c + self.ambient_gain * err

    def _power_at(self, fraction: float, now_fraction: float, power: float) -> float:
        s = self.attention_share
        return self.idle_w + max(power - self.idle_w, 0.0) * (1 - s + s * fraction) / (1 - s + s * now_fraction)

    def decide(self, reading: Reading, state: PolicyState) -> Decision:
        t, last = reading.t, len(self.levels) - 1
        unsafe = _safety(reading, self.emergency_c)
        if reading.temp_c is None:
            new, reason = _move(state, last, t, unsafe, self.levels)
            return Decision(self.levels[last], new, reason)
        trip = reading.trip_c if reading.trip_c is not None else self.default_trip_c
        power = reading.power_w if reading.power_w is not None else (
            (reading.temp_c - (state.ambient_hat_c or self.ambient_c)) / self.r_c_per_w)
        temp_hat, ambient_hat = self._observe(reading, state, power)
        setpoint = trip - self.margin_c
        error = reading.temp_c - setpoint
        integral = state.integral_c
        if not (state.level == last and error > 0):  # anti-windup: no more to give at the smallest level
            integral = min(max(integral + self.ki * error * max(t - (state.last_t or t), 0.0), 0.0), self.integral_max_c)
        state = replace(state, temp_hat_c=temp_hat, ambient_hat_c=ambient_hat, last_t=t, last_power_w=power,
                        integral_c=integral)
        now = self.levels[state.level]
        decay = math.exp(-self.horizon_s / self.tau_s)

        def ahead(fraction: float) -> float:
            steady = ambient_hat + self.r_c_per_w * self._power_at(fraction, now, power)
            return steady + (temp_hat - steady) * decay

        limit = setpoint - integral
        ttt = self._time_to_trip(temp_hat, ambient_hat + self.r_c_per_w * power, trip)
        if unsafe:
            new, reason = _move(state, last, t, unsafe, self.levels)
            return Decision(self.levels[last], new, reason, ttt)
        fits = [i for i, f in enumerate(self.levels) if ahead(f) <= limit]
        if state.level < last and ahead(now) > limit:
            smaller = [i for i in fits if i > state.level]
            target = smaller[0] if smaller else last
            new, reason = _move(state, target, t, f"predicted {ahead(now):.1f} C in {self.horizon_s:g} s > "
                                f"{limit:.1f} C", self.levels)
            return Decision(self.levels[new.level], new, reason, ttt)
        grow = [i for i in range(state.level) if ahead(self.levels[i]) <= limit - self.up_margin_c]
        if grow and t - state.changed_t >= self.min_hold_s:
            new, reason = _move(state, grow[0], t, f"predicted {ahead(self.levels[grow[0]]):.1f} C at "
                                f"{self.levels[grow[0]]:g} <= {limit - self.up_margin_c:.1f} C", self.levels)
            return Decision(self.levels[new.level], new, reason, ttt)
        return Decision(now, state, "", ttt)

    def _time_to_trip(self, temp: float, steady: float, trip: float) -> float | None:
        if temp >= trip:
            return 0.0
        if steady <= trip:
            return None
        return self.tau_s * math.log((steady - temp) / (steady - trip))


Policy = StepPolicy | PredictivePolicy
