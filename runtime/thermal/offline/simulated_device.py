"""A simulated device: a first-order RC thermal model whose power depends on the load and the window.

    C dT/dt = P - (T - T_amb) / R          tau = R C,  steady state T_amb + R P

Power = idle + load * (mlp + attention * window_fraction) (attention cost ~ window, MLP cost fixed).
Above the trip point the clocks drop: latency multiplies by `throttle_slowdown`, power by `throttle_power`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edgeattn.errors import ConfigError
from edgeattn.runtime.thermal.readings import Reading


@dataclass(frozen=True)
class RCModel:
    r_c_per_w: float
    c_j_per_c: float
    ambient_c: float = 25.0

    def __post_init__(self) -> None:
        if not (self.r_c_per_w > 0 and self.c_j_per_c > 0):
            raise ConfigError(f"RC model: expected R > 0 and C > 0, found R={self.r_c_per_w}, C={self.c_j_per_c}")

    @property
    def tau_s(self) -> float:
        return self.r_c_per_w * self.c_j_per_c

    def step(self, temp_c: float, power_w: float, dt: float, ambient_c: float | None = None) -> float:
        """Exact solution over `dt` with power held constant."""
        steady = (self.ambient_c if ambient_c is None else ambient_c) + self.r_c_per_w * power_w
        return steady + (temp_c - steady) * math.exp(-dt / self.tau_s)

    def simulate(self, t: np.ndarray, power_w: np.ndarray, temp0_c: float) -> np.ndarray:
        """Temperatures at the times `t` for power held from each sample to the next."""
        a = np.exp(-np.diff(t) / self.tau_s)
        steady = self.ambient_c + self.r_c_per_w * power_w[:-1]
        out = np.empty(len(t))
        out[0] = temp0_c
        for k in range(len(a)):
            out[k + 1] = steady[k] + (out[k] - steady[k]) * a[k]
        return out


@dataclass(frozen=True)
class DevicePower:
    idle_w: float = 5.0
    mlp_w: float = 12.0  # at full load, independent of the window
    attention_w: float = 18.0  # at full load and full window; scales with the window fraction
    trip_c: float = 99.0
    throttle_slowdown: float = 3.0
    throttle_power: float = 0.6
    base_latency_ms: float = 40.0  # one request at full window, unthrottled
    attention_share: float = 0.5  # share of that latency spent in attention

    def __post_init__(self) -> None:
        if min(self.idle_w, self.mlp_w, self.attention_w) < 0:
            raise ConfigError("device power: expected idle_w, mlp_w, attention_w >= 0")
        if self.throttle_slowdown < 1 or not 0 < self.throttle_power <= 1:
            raise ConfigError("device power: expected throttle_slowdown >= 1 and 0 < throttle_power <= 1")
        if not 0 <= self.attention_share <= 1:
            raise ConfigError(f"attention_share: expected 0..1, found {self.attention_share}")

    def power(self, load: float, fraction: float, throttled: bool) -> float:
        dynamic = load * (self.mlp_w + self.attention_w * fraction)
        return self.idle_w + dynamic * (self.throttle_power if throttled else 1.0)

    def latency_ms(self, fraction: float, throttled: bool) -> float:
        base = self.base_latency_ms * (1 - self.attention_share + self.attention_share * fraction)
        return base * (self.throttle_slowdown if throttled else 1.0)


class SimulatedDevice:
    """A Sensor backed by the RC model. Drive it with `set_load`, `set_window_fraction`, `advance(dt)`."""

    def __init__(self, model: RCModel, device: DevicePower = DevicePower(), noise_c: float = 0.0, seed: int = 0,
                 temp0_c: float | None = None, ambient_c: float | None = None) -> None:
        self.model, self.device = model, device
        self.ambient_c = model.ambient_c if ambient_c is None else ambient_c
        self.temp_c = self.ambient_c if temp0_c is None else temp0_c
        self.noise_c, self.rng = noise_c, np.random.default_rng(seed)
        self.trip_c = device.trip_c
        self.t, self.load, self.fraction = 0.0, 0.0, 1.0

    @property
    def throttled(self) -> bool:
        return self.temp_c >= self.device.trip_c

    @property
    def power_w(self) -> float:
        return self.device.power(self.load, self.fraction, self.throttled)

    def set_load(self, load: float) -> None:
        self.load = float(load)

    def set_window_fraction(self, fraction: float) -> None:
        self.fraction = float(fraction)

    def advance(self, dt: float) -> None:
        self.temp_c = self.model.step(self.temp_c, self.power_w, dt, self.ambient_c)
        self.t += dt

    def clock(self) -> float:
        return self.t

    def read(self) -> Reading:
        noise = self.rng.normal(0.0, self.noise_c) if self.noise_c else 0.0
        return Reading(t=self.t, temps={"sim": self.temp_c + noise}, power_w=self.power_w, throttle=self.throttled,
                       trip_c=self.device.trip_c)

    def close(self) -> None:
        pass
