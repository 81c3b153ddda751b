"""Dense vs 2:4 semi-structured (cuSPARSELt) GEMM time for the Linear shapes of MiniLM and SmolLM2.

Standalone on purpose (only torch and numpy; triton.testing.do_bench when importable, CUDA events
otherwise): it runs on the lent H200 where edgeattn is not installed.

    python benchmarks/sparse_speed_h200.py --out sparse_speed.json [--shapes shapes.json] [--tokens 128,512]

Prints one table (dense vs sparse time per shape and token count, fp16 and int8) and writes JSON that
`edgeattn.quantize.sparsity.speed.load_table` reads (copy it over quantize/sparsity/speed_table.json).
`--shapes` takes a JSON list of {"model", "layer", "N", "K"} (N = out_features, K = in_features).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import numpy as np
import torch

# (model, layer, N = out_features, K = in_features): the distinct Linear shapes of each model.
SHAPES = [
    ("minilm", "attention q/k/v/o, pooler", 384, 384),
    ("minilm", "ffn intermediate", 1536, 384),
    ("minilm", "ffn output", 384, 1536),
    ("smollm2", "attention q/o", 576, 576),
    ("smollm2", "attention k/v (GQA)", 192, 576),
    ("smollm2", "mlp gate/up", 1536, 576),
    ("smollm2", "mlp down", 576, 1536),
    ("smollm2", "lm_head", 49152, 576),
    ("reference", "FIELD_NOTES 4096->16384", 16384, 4096),
    ("reference", "FIELD_NOTES 16384->4096", 4096, 16384),
]
TOKENS = (128, 512, 2048, 8192)  # M = batch * sequence


def bench_ms(fn) -> float:
    """Median milliseconds of fn()."""
    try:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    except ImportError:
        pass
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(50):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def two_four(w: torch.Tensor) -> torch.Tensor:
    """Keep the 2 largest |w| in every 4 consecutive entries along K (the last axis). w: [N, K]."""
    groups = w.reshape(w.shape[0], -1, 4)  # [N, K/4, 4]
    keep = groups.abs().float().topk(2, dim=-1).indices
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True)
    return (groups * mask).reshape_as(w)


def time_fp16(m: int, n: int, k: int) -> tuple[float, float]:
    from torch.sparse import to_sparse_semi_structured

    x = torch.randn(m, k, device="cuda", dtype=torch.float16)  # x: [M, K]
    w = two_four(torch.randn(n, k, device="cuda", dtype=torch.float16))  # w: [N, K]
    ws = to_sparse_semi_structured(w)
    ref = torch.nn.functional.linear(x, w)
    got = torch.nn.functional.linear(x, ws)
    if not torch.allclose(ref, got, rtol=2e-2, atol=2e-1):
        raise RuntimeError(f"sparse result differs from dense by {(ref - got).abs().max().item():.3g}")
    dense = bench_ms(lambda: torch.nn.functional.linear(x, w))
    sparse = bench_ms(lambda: torch.nn.functional.linear(x, ws))
    return dense, sparse


def time_int8(m: int, n: int, k: int) -> tuple[float, float]:
    x = torch.randint(-8, 8, (m, k), device="cuda", dtype=torch.int8)  # x: [M, K]
    w = two_four(torch.randint(-8, 8, (n, k), device="cuda", dtype=torch.int8))  # w: [N, K]
    compressed = torch._cslt_compress(w)
    # W [N, K] @ X^T [K, M] -> [N, M]: the sparse operand must come first for cuSPARSELt.
    wt = w.t()  # column-major [K, N]: the layout cuBLASLt's int8 kernels want (a contiguous copy is slow)
    ref = torch._int_mm(x, wt).t()
    out_dtype = None
    for dtype in (torch.int32, torch.float16, torch.int8):
        try:
            got = torch._cslt_sparse_mm(compressed, x.t(), out_dtype=dtype)
            out_dtype = dtype
            break
        except (RuntimeError, TypeError):
            continue
    if out_dtype is None:
        raise RuntimeError("torch._cslt_sparse_mm takes no int8 output type here")
    if out_dtype == torch.int32 and not torch.equal(got, ref):
        raise RuntimeError("int8 sparse result differs from dense")
    dense = bench_ms(lambda: torch._int_mm(x, wt))
    sparse = bench_ms(lambda: torch._cslt_sparse_mm(compressed, x.t(), out_dtype=out_dtype))
    return dense, sparse


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="sparse_speed.json")
    parser.add_argument("--shapes", help="JSON list of {model, layer, N, K}")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    parser.add_argument("--dtypes", default="fp16,int8")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    shapes = SHAPES
    if args.shapes:
        with open(args.shapes) as f:
            shapes = [(s.get("model", "?"), s.get("layer", "?"), int(s["N"]), int(s["K"])) for s in json.load(f)]
    tokens = [int(t) for t in args.tokens.split(",")]
    timers = {"fp16": time_fp16, "int8": time_int8}
    rows = []
    started = time.time()
    header = f"{'model':9} {'layer':26} {'M':>5} {'N':>6} {'K':>6} {'dtype':5} {'dense ms':>9} {'sparse ms':>9} {'speedup':>8}"
    print(header)
    print("-" * len(header))
    for model, layer, n, k in shapes:
        for m in tokens:
            for dtype in args.dtypes.split(","):
                row = {"model": model, "layer": layer, "M": m, "N": n, "K": k, "dtype": dtype,
                       "dense_ms": None, "sparse_ms": None, "speedup": None, "error": None}
                try:
                    dense, sparse = timers[dtype](m, n, k)
                    row.update(dense_ms=dense, sparse_ms=sparse, speedup=dense / sparse)
                    cells = f"{dense:9.4f} {sparse:9.4f} {dense / sparse:7.2f}x"
                except Exception as exc:  # a shape cuSPARSELt refuses is a result, not a crash
                    row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                    cells = f"{'-':>9} {'-':>9} {'error':>8}  {row['error'][:60]}"
                rows.append(row)
                print(f"{model:9} {layer[:26]:26} {m:5d} {n:6d} {k:6d} {dtype:5} {cells}", flush=True)
                torch.cuda.empty_cache()
    table = {
        "schema": "edgeattn.sparse_speed/1",
        "basis": "measured",
        "device": torch.cuda.get_device_name(0),
        "sm": "%d%d" % torch.cuda.get_device_capability(0),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "method": "median of triton.testing.do_bench (or CUDA events); fp16 F.linear vs "
                  "to_sparse_semi_structured; int8 torch._int_mm vs torch._cslt_sparse_mm",
        "seconds": round(time.time() - started, 1),
        "rows": rows,
    }
    with open(args.out, "w") as f:
        json.dump(table, f, indent=1)
    print(f"wrote {args.out} ({len(rows)} rows, {table['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
