"""One query row's attention on ONNX Runtime's CPU: GroupQueryAttention against MatMul/Softmax/MatMul.

Why `edgeattn build --cached-attention` defaults to `ops` (docs/generation.md, "Two forms of the cached
attention"): the fused form replaces ~25 small nodes a layer by one GroupQueryAttention, which pays at short
contexts, where a decode step is mostly per-node overhead; but at one query row the fused kernel itself is
slower per cached row than the three plain products the `ops` form runs, so at long contexts it loses.

Both run SmolLM2's attention shapes (9 query heads, 3 KV heads, head dim 64), batch 1, one query row, P cached
rows, the way the two forms of the build call them: GroupQueryAttention with packed QKV, rotation inside,
an additive bias and `query_seqlens` (its past sized to take the new row in place); the plain form as the
grouped-query scores `[1, 3, 3, P]`, Softmax and the weighted sum. Alternating blocks, medians.

    python benchmarks/cpu_attention_kernels.py [--threads 2] [--rows 100 516 4000]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

H, HKV, D = 9, 3, 64
RESULTS = Path(__file__).resolve().parent / "results"


def _session(model, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def fused_model():
    from onnx import TensorProto as T
    from onnx import helper as h

    ins = [h.make_tensor_value_info(n, T.FLOAT, None) for n in ("qkv", "pk", "pv", "bias", "cos", "sin")]
    ins += [h.make_tensor_value_info(n, T.INT32, None) for n in ("seqlens", "total", "qsl")]
    ins += [h.make_tensor_value_info("pid", T.INT64, None)]
    node = h.make_node("GroupQueryAttention", ["qkv", "", "", "pk", "pv", "seqlens", "total", "cos", "sin", "pid",
                                               "bias", "", "", "", "", "", "qsl"], ["o", "pk_o", "pv_o"],
                       domain="com.microsoft", num_heads=H, kv_num_heads=HKV, scale=D ** -0.5, do_rotary=1)
    graph = h.make_graph([node], "fused", ins, [h.make_tensor_value_info("o", T.FLOAT, None)])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 21), h.make_opsetid("com.microsoft", 1)])


def plain_model():
    from onnx import TensorProto as T
    from onnx import helper as h

    ins = [h.make_tensor_value_info(n, T.FLOAT, None) for n in ("q", "k", "v", "bias")]
    nodes = [h.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             h.make_node("MatMul", ["q", "kt"], ["s"]),  # [1, H_kv, G, P]
             h.make_node("Add", ["s", "bias"], ["sb"]),
             h.make_node("Softmax", ["sb"], ["p"], axis=-1),
             h.make_node("MatMul", ["p", "v"], ["o"])]  # [1, H_kv, G, D]
    graph = h.make_graph(nodes, "plain", ins, [h.make_tensor_value_info("o", T.FLOAT, None)])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 21)])


def feeds(rows: int, rng) -> tuple[dict, dict]:
    total = rows + 1  # the past holds room for the new row (GroupQueryAttention writes it in place)
    k = rng.standard_normal((1, HKV, total, D)).astype(np.float32)
    v = rng.standard_normal((1, HKV, total, D)).astype(np.float32)
    fused = {"qkv": rng.standard_normal((1, 1, (H + 2 * HKV) * D)).astype(np.float32), "pk": k, "pv": v,
             "seqlens": np.array([total - 1], np.int32), "total": np.array(total, np.int32),
             "bias": np.zeros((1, 1, 1, total), np.float32), "qsl": np.array([1], np.int32),
             "cos": np.ones((total + 1, D // 2), np.float32), "sin": np.zeros((total + 1, D // 2), np.float32),
             "pid": np.zeros((1, 1), np.int64)}
    plain = {"q": rng.standard_normal((1, HKV, H // HKV, D)).astype(np.float32), "k": k, "v": v,
             "bias": np.zeros((1, 1, H // HKV, total), np.float32)}
    return fused, plain


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, nargs="+", default=[100, 516, 4000], help="cached rows P")
    parser.add_argument("--blocks", type=int, default=30, help="alternating blocks of 10 calls each")
    args = parser.parse_args(argv)
    import onnxruntime

    sessions = {"GroupQueryAttention": _session(fused_model(), args.threads),
                "MatMul/Softmax/MatMul": _session(plain_model(), args.threads)}
    rng = np.random.default_rng(0)
    rows_out = []
    print(f"| cached rows | GroupQueryAttention ms | MatMul/Softmax/MatMul ms | ratio |  ({args.threads} threads)")
    print("|---|---|---|---|")
    for rows in args.rows:
        inputs = dict(zip(sessions, feeds(rows, rng)))
        times = {name: [] for name in sessions}
        for _ in range(args.blocks):
            for name, sess in sessions.items():
                for _ in range(3):
                    sess.run(None, inputs[name])
                t0 = time.perf_counter()
                for _ in range(10):
                    sess.run(None, inputs[name])
                times[name].append((time.perf_counter() - t0) / 10)
        fused, plain = (1e3 * float(np.median(times[n])) for n in sessions)
        rows_out.append({"rows": rows, "group_query_attention_ms": fused, "plain_ms": plain})
        print(f"| {rows} | {fused:.3f} | {plain:.3f} | {fused / plain:.2f} |")
    result = {"threads": args.threads, "onnxruntime": onnxruntime.__version__, "processor": platform.processor()
              or platform.machine(), "loadavg": Path("/proc/loadavg").read_text().split()[:3], "rows": rows_out}
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"cpu_attention_kernels_{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
