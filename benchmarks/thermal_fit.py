"""`fit` recovers R and C from synthetic RC traces with sensor noise (the issue asks: within 10%).

    python benchmarks/thermal_fit.py
"""

from __future__ import annotations

import numpy as np

from edgeattn.runtime.thermal.offline.fit import fit_rc
from edgeattn.runtime.thermal.offline.simulated_device import RCModel
from edgeattn.runtime.thermal.sensors.trace import Trace

CASES = [  # (R C/W, C J/C, ambient C, sensor noise C, label)
    (2.0, 60.0, 25.0, 0.3, "fanless Jetson-like, tau 120 s"),
    (1.5, 80.0, 35.0, 0.5, "hot cabinet, noisy sensor"),
    (0.12, 400.0, 30.0, 0.25, "dGPU-like (300 W), tau 48 s"),
    (0.5, 1200.0, 22.0, 1.0, "slow heatsink, tau 600 s, 1 C noise"),
]


def trace(r, c, ambient, noise, seed, seconds=2400.0, dt=0.5):
    rng = np.random.default_rng(seed)
    t = np.arange(0, seconds, dt)
    high = 30.0 / r  # a power step worth ~30 C of rise
    power = np.where((t // 200) % 2 == 0, high, 0.25 * high) * (1 + rng.normal(0, 0.02, len(t)))
    temp = RCModel(r, c, ambient).simulate(t, power, ambient + 5) + rng.normal(0, noise, len(t))
    return Trace({"t": t, "temp_c": temp, "power_w": power})


def main() -> None:
    print(f"{'case':40} {'R true':>7} {'R fit':>8} {'err':>6} {'C true':>7} {'C fit':>8} {'err':>6} {'rmse C':>7}")
    worst = 0.0
    for r, c, ambient, noise, label in CASES:
        for seed in range(3):
            fit = fit_rc(trace(r, c, ambient, noise, seed))
            er, ec = fit.r_c_per_w / r - 1, fit.c_j_per_c / c - 1
            worst = max(worst, abs(er), abs(ec))
            print(f"{label + f' (seed {seed})':40} {r:7.3g} {fit.r_c_per_w:8.4g} {er:+6.1%} {c:7.4g} "
                  f"{fit.c_j_per_c:8.4g} {ec:+6.1%} {fit.rmse_c:7.3f}")
    print(f"worst relative error over all cases: {worst:.2%} (target < 10%)")


if __name__ == "__main__":
    main()
