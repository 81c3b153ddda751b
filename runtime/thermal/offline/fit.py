"""Identify the RC model (R, C, ambient) from a trace of temperature and power.

Two steps: a linear regression on the one-step model T[k+1] = a T[k] + b P[k] + c gives a start; then a
nonlinear least-squares fit of the simulated temperature to the measured one (output error, unbiased
under sensor noise, unlike the one-step regression) over R, tau, ambient and the initial temperature.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from edgeattn.errors import InputError
from edgeattn.optional import require
from edgeattn.runtime.thermal.offline.simulated_device import RCModel
from edgeattn.runtime.thermal.sensors.trace import Trace

MIN_SAMPLES = 20


@dataclass(frozen=True)
class FitResult:
    r_c_per_w: float
    c_j_per_c: float
    tau_s: float
    ambient_c: float
    rmse_c: float
    samples: int
    duration_s: float
    notes: tuple[str, ...] = ()  # what limits the fit (e.g. tau at the sampling interval)

    @property
    def model(self) -> RCModel:
        return RCModel(self.r_c_per_w, self.c_j_per_c, self.ambient_c)

    def to_dict(self) -> dict:
        return {**asdict(self), "notes": list(self.notes)}


def _clean(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t, temp, power = trace["t"], trace["temp_c"], trace["power_w"]
    keep = np.isfinite(t) & np.isfinite(temp) & np.isfinite(power)
    t, temp, power = t[keep], temp[keep], power[keep]
    order = np.argsort(t, kind="stable")
    t, temp, power = t[order], temp[order], power[order]
    unique = np.concatenate(([True], np.diff(t) > 0))
    return t[unique], temp[unique], power[unique]


def _start(t: np.ndarray, temp: np.ndarray, power: np.ndarray) -> tuple[float, float, float]:
    """(R, tau, ambient) from the one-step regression, with safe fallbacks."""
    dt = float(np.median(np.diff(t)))
    x = np.column_stack([temp[:-1], power[:-1], np.ones(len(t) - 1)])
    (a, b, c), *_ = np.linalg.lstsq(x, temp[1:], rcond=None)
    if 0 < a < 1 and b > 0:
        tau, r = -dt / math.log(a), b / (1 - a)
        return r, tau, c / (1 - a)
    r = max((temp.max() - temp.min()) / max(np.ptp(power), 1e-6), 1e-3)
    return r, max((t[-1] - t[0]) / 5, dt), float(temp.min() - r * power.min())


def fit_rc(trace: Trace) -> FitResult:
    t, temp, power = _clean(trace)
    if len(t) < MIN_SAMPLES:
        raise InputError(f"fit: expected at least {MIN_SAMPLES} rows with t, temp_c and power_w, found {len(t)}")
    spread = float(np.ptp(power))
    if spread < max(0.05 * float(np.mean(np.abs(power))), 0.1):
        raise InputError(f"fit: power must change during the trace to separate R from the ambient; it spans only "
                         f"{spread:.2f} W around {np.mean(power):.1f} W (record while a load switches on and off)")
    optimize = require("scipy.optimize", "fitting the RC model (pip install scipy)")
    r0, tau0, amb0 = _start(t, temp, power)
    span = t[-1] - t[0]
    tau0 = min(max(tau0, 1e-2 * span, 0.5 * float(np.median(np.diff(t)))), 10 * span)

    def residual(p: np.ndarray) -> np.ndarray:
        r, log_tau, amb, t0 = p
        model = RCModel(r, math.exp(log_tau) / r, amb)
        return model.simulate(t, power, t0) - temp

    x0 = np.array([max(r0, 1e-4), math.log(tau0), amb0, temp[0]])
    dt = float(np.median(np.diff(t)))
    tau_min = 0.25 * dt  # faster responses are not observable at this sampling rate
    lower = [1e-6, math.log(tau_min), -100.0, -100.0]
    upper = [1e3, math.log(100 * span + 1), 200.0, 200.0]
    sol = optimize.least_squares(residual, np.clip(x0, lower, upper), bounds=(lower, upper), x_scale="jac")
    r, log_tau, amb, _ = sol.x
    tau = math.exp(log_tau)
    rmse = float(np.sqrt(np.mean(sol.fun ** 2)))
    notes = []
    if tau < 2 * dt:
        notes.append(f"tau {tau:.3g} s is below two sampling intervals ({dt:.3g} s): the temperature follows the "
                     f"power faster than it is sampled (or the power reading lags); R and ambient (the steady "
                     f"state) hold, tau only bounds the response from above")
    if rmse > 1.0:
        notes.append(f"fit error {rmse:.2f} C: the device is not one RC stage (or the power reading is averaged); "
                     f"keep policy margins above this error")
    return FitResult(r_c_per_w=float(r), c_j_per_c=float(tau / r), tau_s=float(tau), ambient_c=float(amb),
                     rmse_c=rmse, samples=len(t), duration_s=float(span), notes=tuple(notes))


def load_model(data: dict, source: str = "model") -> RCModel:
    """An RCModel from a fit's JSON object (r_c_per_w, c_j_per_c, ambient_c)."""
    try:
        return RCModel(float(data["r_c_per_w"]), float(data["c_j_per_c"]), float(data.get("ambient_c", 25.0)))
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{source}: expected r_c_per_w, c_j_per_c (and ambient_c) numbers: {exc}") from exc
