"""The window -> quality table used by `edgeattn thermal tune`.

    python benchmarks/thermal_quality.py              # print the shipped table
    python benchmarks/thermal_quality.py --measure    # re-measure SmolLM2 perplexity (CPU, a few minutes)
        [--chunks 3] [--write]                        # --write replaces the shipped table

FIELD_NOTES (other text, 512 tokens): full 31.9; W256+4 sinks 31.7; W128 33.2; W64 36.0; W32 40.7.
"""

from __future__ import annotations

import argparse
import json
import time
from importlib import resources

from edgeattn.runtime.thermal.offline.quality import DEFAULT_TABLE, load_table, measure_perplexity


def show(table) -> None:
    print(f"{table.model}: {table.metric} per window ({table.sinks} sinks, max window {table.max_window})")
    print(f"  full  {table.full:7.2f}  quality 1.000")
    for w, v in sorted(table.windows.items(), reverse=True):
        print(f"  W{w:<4} {v:7.2f}  quality {table.quality(w / table.max_window):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measure", action="store_true")
    ap.add_argument("--chunks", type=int, default=3)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    if not args.measure:
        show(load_table())
        return
    start = time.perf_counter()
    table = measure_perplexity(chunks=args.chunks)
    show(table)
    print(f"measured on {args.chunks} x 512 held-out tokens in {time.perf_counter() - start:.0f} s")
    if args.write:
        path = resources.files("edgeattn.runtime.thermal").joinpath(DEFAULT_TABLE)
        data = {**table.to_dict(), "text": f"gensim lee.cor, {args.chunks} chunks of 512 tokens"}
        from pathlib import Path

        from edgeattn import atomic

        atomic.write_text(Path(str(path)), json.dumps(data, indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
