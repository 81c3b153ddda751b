"""ONNX Runtime (CPU) time of one edgeattn::WindowedAttention layer as the window shrinks.

    python benchmarks/attention_window_ort.py [--seq 4096] [--heads 8] [--dim 64] [--repeat 5]

Runs the portable ONNX body (docs/windowed-attention.md) on B=1 and prints a table: window, median
time, time relative to the full window, and the max abs error against the float64 reference (checked
on the first query rows). The issue's bar: W=512 takes at most a quarter of the full-window time.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from edgeattn.attention.onnx_node import attach_function, make_node
from edgeattn.attention.reference import windowed_attention_np


def layer(causal: bool) -> onnx.ModelProto:
    """q, k, v [B, H, S, D] + window -> out [B, H, S, D]: one WindowedAttention node."""
    dims = ["b", "h", "s", "d"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n in ("q", "k", "v")]
    inputs.append(helper.make_tensor_value_info("window", TensorProto.INT64, []))
    node = make_node("q", "k", "v", "window", out="out", causal=causal)
    graph = helper.make_graph([node], "attention", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, dims)])
    return attach_function(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def dense_layer(causal: bool) -> onnx.ModelProto:
    """Plain softmax(q k^T * scale + causal mask) v with standard ops: the baseline a full window competes with."""
    dims = ["b", "h", "s", "d"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n in ("q", "k", "v")]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Mul", ["s", "scale"], ["scaled"])]
    inits = [helper.make_tensor("scale", TensorProto.FLOAT, [], [0.125])]
    if causal:  # additive -inf above the diagonal, from Trilu on a [S, S] tensor of -inf
        nodes += [helper.make_node("Shape", ["q"], ["qs"], start=2, end=3),
                  helper.make_node("Concat", ["qs", "qs"], ["ss"], axis=0),
                  helper.make_node("ConstantOfShape", ["ss"], ["neg"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [-np.inf])),
                  helper.make_node("Trilu", ["neg", "one"], ["bias"], upper=1),
                  helper.make_node("Add", ["scaled", "bias"], ["masked"])]
        inits.append(helper.make_tensor("one", TensorProto.INT64, [], [1]))
    nodes += [helper.make_node("Softmax", ["masked" if causal else "scaled"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["out"])]
    graph = helper.make_graph(nodes, "dense", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, dims)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _median_ms(sess, feeds, repeat: int) -> float:
    sess.run(None, feeds)  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--windows", default="512,1024,2048,0", help="comma separated; 0 = full")
    ap.add_argument("--bidirectional", action="store_true")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    sess = ort.InferenceSession(layer(not args.bidirectional).SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, args.heads, args.seq, args.dim)).astype(np.float32) for _ in range(3))
    rows = []
    for w in (int(x) for x in args.windows.split(",")):
        feeds = {"q": q, "k": k, "v": v, "window": np.array(w, np.int64)}
        out = sess.run(None, feeds)[0]
        ms = _median_ms(sess, feeds, args.repeat)
        n = 256  # check the last rows against the float64 reference (decode form: same rows, same keys)
        want = windowed_attention_np(q[:, :, -n:], k, v, w, causal=not args.bidirectional) if not args.bidirectional \
            else windowed_attention_np(q, k, v, w, causal=False)[:, :, -n:]
        rows.append((w, ms, float(np.abs(out[:, :, -n:] - want).max())))
    full = next((t for w, t, _ in rows if w == 0 or w >= args.seq), rows[-1][1])
    dense = ort.InferenceSession(dense_layer(not args.bidirectional).SerializeToString(), opts,
                                 providers=["CPUExecutionProvider"])
    dense_ms = _median_ms(dense, {"q": q, "k": k, "v": v}, args.repeat)
    mode = "bidirectional" if args.bidirectional else "causal"
    print(f"ONNX Runtime {ort.__version__} CPU, one layer, B=1 H={args.heads} D={args.dim} S={args.seq}, {mode}")
    print(f"{'window':>8} {'ms (median)':>12} {'vs full':>8} {'max abs err':>12}")
    for w, t, err in rows:
        print(f"{(w if w else 'full'):>8} {t:12.1f} {t / full:8.3f} {err:12.2e}")
    print(f"{'dense':>8} {dense_ms:12.1f} {dense_ms / full:8.3f}  (plain softmax(QK^T)V, no window: the baseline)")
    print(f"W=512 / full = {next(t for w, t, _ in rows if w == 512) / full:.3f}" if any(w == 512 for w, *_ in rows) else "")


if __name__ == "__main__":
    main()
