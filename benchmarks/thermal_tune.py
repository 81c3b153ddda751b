"""The issue's simulation figures: tuned predictive policy vs the fixed 75/85 C step rule, hot ambient.

    python benchmarks/thermal_tune.py [--quick]

Device: RC model R 2.0 C/W, C 60 J/C (tau 120 s); 45 C ambient; trip 99 C; full load at full window
35 W (steady 115 C, crosses), half 26 W (97 C), quarter 21.5 W (88 C); sensor noise 0.3 C; 2 Hz.
The tuned policy is checked on seeds it was not tuned on.
"""

from __future__ import annotations

import argparse
import time

from edgeattn.runtime.thermal.policies import StepPolicy
from edgeattn.runtime.thermal.offline.quality import load_table
from edgeattn.runtime.thermal.offline.simulate import simulate
from edgeattn.runtime.thermal.offline.simulated_device import RCModel
from edgeattn.runtime.thermal.offline.tune import TuneConfig, tune
from edgeattn.runtime.thermal.offline.workload import PRESETS

MODEL = RCModel(r_c_per_w=2.0, c_j_per_c=60.0, ambient_c=25.0)  # as fitted in a 25 C room
STEP = StepPolicy(levels=(1.0, 0.5, 0.25), thresholds_c=(75.0, 85.0), hysteresis_c=3.0, min_hold_s=10.0)
CHECK_SEEDS = range(10, 20)


def row(name, summaries):
    n = len(summaries)
    print(f"{name:28} max {max(s.max_temp_c for s in summaries):6.2f} C  crossings {sum(s.trip_crossings for s in summaries):2d}  "
          f"mean window {sum(s.mean_window_fraction for s in summaries) / n:.3f}  "
          f"changes/min {sum(s.window_changes_per_min for s in summaries) / n:.2f} (max "
          f"{max(s.window_changes_per_min for s in summaries):.2f})  quality-weighted throughput "
          f"{sum(s.quality_weighted_throughput for s in summaries) / n:.4f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    workload, quality = PRESETS["hot-ambient"], load_table()
    config = TuneConfig(margins_c=(2.0, 5.0), horizons_s=(60.0,), min_holds_s=(30.0,), up_margins_c=(2.0,),
                        level_sets=((1.0, 0.5, 0.25),), r_errors=(0.0,)) if args.quick else TuneConfig()
    start = time.perf_counter()
    best, trials = tune(MODEL, workload, quality, config)
    p = best.policy
    print(f"tuned over {len(trials)} candidates x {len(config.seeds)} seeds x R errors {list(config.r_errors)} in {time.perf_counter() - start:.0f} s: "
          f"margin {p.margin_c:g} C, horizon {p.horizon_s:g} s, min hold {p.min_hold_s:g} s, up margin "
          f"{p.up_margin_c:g} C, levels {list(p.levels)}")
    print(f"workload {workload.name}: {workload.duration_s:g} s, ambient {workload.ambient_c:g} C, trip "
          f"{workload.device.trip_c:g} C; figures over {len(CHECK_SEEDS)} held-out noise seeds")
    row("step 75/85 C (full/half/qtr)", [simulate(MODEL, STEP, workload, quality, seed=s).summary for s in CHECK_SEEDS])
    row("tuned predictive", [simulate(MODEL, p, workload, quality, seed=s).summary for s in CHECK_SEEDS])
    hotter = RCModel(MODEL.r_c_per_w * 1.05, MODEL.c_j_per_c, MODEL.ambient_c)
    row("tuned, device R +5%", [simulate(hotter, p, workload, quality, seed=s).summary for s in CHECK_SEEDS])
    row("step 75/85, device R +5%", [simulate(hotter, STEP, workload, quality, seed=s).summary for s in CHECK_SEEDS])


if __name__ == "__main__":
    main()
