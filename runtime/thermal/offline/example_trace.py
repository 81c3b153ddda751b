"""An example Jetson-class thermal trace, shipped with the package: a device that heats toward its trip point.

The trace is what `edgeattn thermal record` would write on an Orin-class module in a passively cooled
enclosure running inference in bursts: generated from the first-order RC model (`simulated_device.RCModel`)
with the numbers below, sampled at 1 Hz with sensor noise, and kept below the trip point (99 C, the Orin
software throttle). Fitting it gives back that model, and `thermal simulate` / `tune` on the fit show the
window shrinking under load, which a data-center GPU trace (tens of degrees of headroom) never does.

    python -m edgeattn.runtime.thermal.offline.example_trace --out orin_trace.csv
"""

from __future__ import annotations

import argparse
import shutil
from importlib import resources
from pathlib import Path

import numpy as np

from edgeattn.runtime.thermal.offline.simulated_device import RCModel

FILE_NAME = "orin_example_trace.csv"
# 1.9 C/W: a ~30 W module whose fanless case holds it ~60 C above ambient at full load (a fan-cooled dev kit is
# nearer 1 C/W); C 100 J/C: a module plus heat spreader, tau = R C = 190 s; ambient 35 C (a warm cabinet)
ORIN_MODEL = RCModel(r_c_per_w=1.9, c_j_per_c=100.0, ambient_c=35.0)
TRIP_C = 99.0  # Orin software throttle trip point (shutdown at 104.5 C)
# (seconds, module power in W): idle, a long inference burst, a pause, a lighter load, a second burst, idle
PHASES = ((120, 8.0), (480, 32.0), (240, 9.0), (300, 24.0), (180, 32.0), (180, 8.0))
HZ, NOISE_C, POWER_NOISE_W, SEED = 1.0, 0.25, 0.3, 0
GPU_MHZ = 1300  # Orin GPU clock at full load (no throttle in this trace)


def generate(seed: int = SEED) -> list[dict]:
    """The trace's rows (t, temp_c, power_w, clock_mhz, throttle), deterministic for a seed."""
    rng = np.random.default_rng(seed)
    power = np.concatenate([np.full(int(seconds * HZ), watts) for seconds, watts in PHASES])
    power = power + rng.normal(0.0, POWER_NOISE_W, len(power))
    t = np.arange(len(power)) / HZ
    start = ORIN_MODEL.ambient_c + ORIN_MODEL.r_c_per_w * PHASES[0][1]  # idle steady state
    temp = ORIN_MODEL.simulate(t, power, start) + rng.normal(0.0, NOISE_C, len(t))
    return [{"t": round(float(ti), 3), "temp_c": round(float(c), 1), "power_w": round(float(p), 2),
             "clock_mhz": GPU_MHZ if p > 12 else 420, "throttle": 0} for ti, c, p in zip(t, temp, power)]


def path() -> Path:
    """Where the shipped trace lies."""
    return Path(str(resources.files(__package__).joinpath(FILE_NAME)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write the shipped Orin-class example thermal trace (CSV).")
    parser.add_argument("--out", type=Path, required=True, help="Where to write the trace.")
    parser.add_argument("--regenerate", action="store_true", help="Generate it anew instead of copying the shipped file.")
    args = parser.parse_args(argv)
    if args.regenerate:
        from edgeattn import atomic
        from edgeattn.runtime.thermal.sensors.trace import rows_to_csv

        atomic.write_text(args.out, rows_to_csv(generate()))
    else:
        shutil.copyfile(path(), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
