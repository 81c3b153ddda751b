"""A GPU heat load with on/off phases, so power steps give a trace that `edgeattn thermal fit` can use.

    python benchmarks/gpu_heat_load.py --seconds 70 --on 15 --off 15 &
    python -m edgeattn.cli.main thermal record --source nvml --seconds 60 --out trace.csv

Standalone (torch only): bf16 matmuls of --size in the on phases, idle in the off phases.
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--on", type=float, default=15.0, help="seconds of load per cycle")
    ap.add_argument("--off", type=float, default=15.0, help="seconds idle per cycle")
    ap.add_argument("--idle-first", type=float, default=5.0, help="idle seconds before the first load phase")
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU visible to torch")
    a = torch.randn(args.size, args.size, device=args.device, dtype=torch.bfloat16)  # [N, N]
    b = torch.randn(args.size, args.size, device=args.device, dtype=torch.bfloat16)  # [N, N]
    start = time.monotonic()
    time.sleep(args.idle_first)
    products = 0
    while (now := time.monotonic() - start) < args.seconds:
        phase = (now - args.idle_first) % (args.on + args.off)
        if phase < args.on:
            for _ in range(20):
                c = a @ b
            torch.cuda.synchronize()
            products += 20
        else:
            time.sleep(min(0.2, args.on + args.off - phase))
    del c
    tflops = 2 * args.size ** 3 * products / 1e12
    print(f"heat load done: {products} products of {args.size}^3 bf16 ({tflops:.0f} TFLOP) in {args.seconds:g} s, "
          f"{args.on:g} s on / {args.off:g} s off")


if __name__ == "__main__":
    main()
