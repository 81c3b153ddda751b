"""Heat under a sustained generation load (issue 18): the thermal simulator driven by the measured decode cost of
each window at a 4,000-token context, with the controller and with a fixed full window.

    python benchmarks/generation_heat.py measure --bundle build/gen/smollm2_fp32.edgeattn --out costs.json
    python benchmarks/generation_heat.py simulate --costs costs.json --plots docs/images

`measure` prefills 4,000 tokens once into a 4,096-row ring, then times decode steps at each window (the context
stays at 4,000: each step's row is overwritten by the next). `simulate` fits latency(window) = a + b * fraction to
those costs, gives the simulated device the same split of its power (the MLP's share is paid at every window,
attention's scales with the window), and runs the same load trace twice: the predictive controller, and the window
held at full. It prints max temperature, time throttled, and p50/p99 inter-token latency against the cool device
(full window, never throttled), and plots both runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

WINDOWS = (4096, 2048, 1024, 512, 256)
CONTEXT = 4000


def measure(bundle: str, steps: int, threads: int) -> dict:
    from edgeattn.runtime.generation.generator import Generator

    rows = {}
    with Generator.open(bundle, window_max=max(WINDOWS), threads=threads) as gen:
        model = gen.model
        cache = model.new_cache(1)
        ids = (np.arange(CONTEXT) % 5000 + 100).astype(np.int64)
        for start in range(0, CONTEXT, 256):
            model.step(cache, [0], ids[None, start:start + 256], 0)
        for w in WINDOWS:
            times = []
            for i in range(steps + 2):
                cache.positions[0] = CONTEXT
                t = time.perf_counter()
                model.step(cache, [0], np.array([[7 + i]]), 0 if w == max(WINDOWS) else w)
                times.append(time.perf_counter() - t)
            rows[w] = 1e3 * statistics.median(times[2:])
            print(f"window {w}: {rows[w]:.1f} ms per token", flush=True)
    return {"context": CONTEXT, "ring": max(WINDOWS), "ms_per_token": rows, "threads": threads}


def simulate(costs: dict, plots: Path | None) -> dict:
    from edgeattn.runtime.thermal.offline.simulate import plot, simulate as run
    from edgeattn.runtime.thermal.offline.simulated_device import DevicePower, RCModel
    from edgeattn.runtime.thermal.offline.workload import Workload
    from edgeattn.runtime.thermal.policies import PredictivePolicy, StepPolicy

    ring = int(costs["ring"])
    ws = np.array(sorted(int(w) for w in costs["ms_per_token"]))
    ms = np.array([float(costs["ms_per_token"][str(w)] if str(w) in costs["ms_per_token"] else
                         costs["ms_per_token"][w]) for w in ws])
    frac = ws / ring
    b, a = np.polyfit(frac, ms, 1)  # ms = a + b * fraction
    base, share = a + b, b / (a + b)
    dynamic_w = 25.0  # a Jetson-class module's dynamic power at full load
    device = DevicePower(idle_w=5.0, mlp_w=dynamic_w * (1 - share), attention_w=dynamic_w * share, trip_c=99.0,
                         base_latency_ms=base, attention_share=share)
    model = RCModel(r_c_per_w=1.9, c_j_per_c=60.0, ambient_c=45.0)  # tau 114 s; full load, full window: 102 C
    trace = ((60, 0.0), (1200, 1.0), (120, 0.5), (600, 1.0))
    work = Workload("generation-4k", trace, ambient_c=45.0, max_window=ring, device=device)
    policies = {"controller": PredictivePolicy(r_c_per_w=model.r_c_per_w, tau_s=model.tau_s, ambient_c=45.0,
                                               idle_w=5.0, attention_share=share,
                                               levels=(1.0, 0.5, 0.25, 0.125, 0.0625)),
                "fixed full window": StepPolicy(levels=(1.0,), thresholds_c=())}
    out = {"fit": {"a_ms": a, "b_ms": b, "base_latency_ms": base, "attention_share": share}, "runs": {}}
    for name, policy in policies.items():
        result = run(model, policy, work)
        s = result.series
        busy = s["load"] > 0
        lat = s["latency_ms"][busy]
        out["runs"][name] = {"max_temp_c": result.summary.max_temp_c, "trip_c": 99.0,
                             "throttled_s": result.summary.throttled_s,
                             "p50_itl_ms": float(np.percentile(lat, 50)), "p99_itl_ms": float(np.percentile(lat, 99)),
                             "p99_vs_cool": float(np.percentile(lat, 99) / base),
                             "mean_window_fraction": result.summary.mean_window_fraction}
        if plots is not None:
            plots.mkdir(parents=True, exist_ok=True)
            r = out["runs"][name]
            plot(result, plots / f"generation_heat_{name.split()[0]}.png",
                 f"{name}: max {r['max_temp_c']:.1f} C (trip 99), throttled {r['throttled_s']:.0f} s, "
                 f"p99 inter-token {r['p99_itl_ms']:.0f} ms = {r['p99_vs_cool']:.2f}x the cool device")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--bundle", required=True)
    m.add_argument("--steps", type=int, default=16)
    m.add_argument("--threads", type=int, default=2)
    m.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("simulate")
    s.add_argument("--costs", type=Path, required=True)
    s.add_argument("--plots", type=Path)
    s.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.cmd == "measure":
        result = measure(args.bundle, args.steps, args.threads)
        args.out.write_text(json.dumps(result, indent=1))
    else:
        result = simulate(json.loads(args.costs.read_text()), args.plots)
        print(json.dumps(result, indent=1))
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
