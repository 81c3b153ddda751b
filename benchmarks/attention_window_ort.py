"""ONNX Runtime (CPU) time of one edgeattn::WindowedAttention layer as the window shrinks.

    python benchmarks/attention_window_ort.py [--seq 4096] [--heads 8] [--dim 64] [--repeat 5]

Runs the portable ONNX body (docs/windowed-attention.md) on B=1 and prints a table: window, min and
median time over interleaved runs, min time relative to the full window, and the max abs error
against the float64 reference (the last 256 query rows). A plain dense softmax(QK^T)V row is the
no-window baseline. The issue's bar: W=512 takes at most a quarter of the full-window time.
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
    windows = [int(x) for x in args.windows.split(",")]
    runs = [(w, sess, {"q": q, "k": k, "v": v, "window": np.array(w, np.int64)}) for w in windows]
    dense = ort.InferenceSession(dense_layer(not args.bidirectional).SerializeToString(), opts,
                                 providers=["CPUExecutionProvider"])
    runs.append(("dense", dense, {"q": q, "k": k, "v": v}))
    outs = {w: s_.run(None, f)[0] for w, s_, f in runs}  # warm-up, and the outputs checked below
    times: dict = {w: [] for w, _, _ in runs}
    for _ in range(args.repeat):  # interleaved, so load changes on a shared machine hit every row alike
        for w, s_, f in runs:
            t0 = time.perf_counter()
            s_.run(None, f)
            times[w].append((time.perf_counter() - t0) * 1e3)
    n = 256  # check the last rows against the float64 reference
    causal = not args.bidirectional
    full_key = next((w for w in windows if w == 0 or w >= args.seq), windows[-1])
    best = {w: min(t) for w, t in times.items()}
    print(f"ONNX Runtime {ort.__version__} CPU, one layer, B=1 H={args.heads} D={args.dim} S={args.seq}, "
          f"{'causal' if causal else 'bidirectional'}, {args.repeat} interleaved runs")
    print(f"{'window':>8} {'min ms':>9} {'median ms':>10} {'min/full':>9} {'max abs err':>12}")
    for w in windows + ["dense"]:
        if w == "dense":
            err = "(plain softmax(QK^T)V with a causal mask: the no-window baseline)"
        else:
            want = (windowed_attention_np(q[:, :, -n:], k, v, w, causal=True) if causal
                    else windowed_attention_np(q, k, v, w, causal=False)[:, :, -n:])
            err = f"{float(np.abs(outs[w][:, :, -n:] - want).max()):12.2e}"
        label = "full" if w == 0 else w
        print(f"{label:>8} {best[w]:9.1f} {float(np.median(times[w])):10.1f} {best[w] / best[full_key]:9.3f} {err}")
    if 512 in best:
        print(f"W=512 / full window (min times): {best[512] / best[full_key]:.3f}")


if __name__ == "__main__":
    main()
