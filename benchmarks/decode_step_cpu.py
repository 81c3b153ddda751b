"""One decode step of a decoder graph alone on ONNX Runtime (no generation loop, no host work but the run).

    .venv/bin/python benchmarks/decode_step_cpu.py                          # our fast path vs onnxruntime-genai, int4
    .venv/bin/python benchmarks/decode_step_cpu.py --precision fp32 --rounds 5
    .venv/bin/python benchmarks/decode_step_cpu.py --graph old=path/to/model.fast_path.onnx   # any other graph beside
    .venv/bin/python benchmarks/decode_step_cpu.py --only edgeattn --prompt 32 464 3000 --ring 16 128 512 960 --rounds 6

`--prompt N [N ...]` starts the timed steps after N prompt tokens (default 32): the fast path's GroupQueryAttention
then reads N + 1 to N + 96 cached rows in place (several values: every graph at each, in turns). `--only` times some
of the default graphs. `--ring W [W ...]` also times the bundle's ring graph (`model.ort.onnx`, what a stream past its
window runs) at `--position` (default 1000) reading the sinks and the last W rows of a cache of random rows: the
fast path's GroupQueryAttention reads cache rows in place, the ring graph gathers the rows it reads, then reads them.
Each graph runs in its own process (ONNX Runtime's idle thread pool spins after a run: two sessions in one
process slow each other), 2 threads, its cache buffers bound as inputs and outputs (IO binding, in place), a
32-token prompt and then one token a step; the figure is the median `run_with_iobinding` time over the decode
steps after a warm-up. Graphs take turns, round by round, so a drifting host moves them alike.
The graphs: "edgeattn" is the fast path of build/gen's bundle (`model.fast_path.onnx`), "onnxruntime-genai" the
model its builder wrote (`generation_cpu.py prepare --peers`). Together with `generation_cpu.py speed` it
tells the graph's share of a step from the host's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GEN = ROOT / "build" / "gen"
THREADS, PROMPT, STEPS, WARMUP = 2, 32, 96, 8


def graphs(precision: str) -> dict[str, Path]:
    return {"edgeattn": GEN / f"smollm2_{precision}.edgeattn" / "model.fast_path.onnx",
            "onnxruntime-genai": GEN / f"genai_{precision}" / "model.onnx"}


def measure(path: Path, prompt: int = PROMPT) -> float:
    """Median seconds of one decode step's run (in this process)."""
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    pasts = sorted(n for n in inputs if n.startswith("past_key_values."))
    _, kv_heads, _, head_dim = inputs[pasts[0]].shape
    if not isinstance(head_dim, int):  # onnxruntime-genai's graphs leave it symbolic; their config says it
        head_dim = json.loads((path.parent / "genai_config.json").read_text())["model"]["decoder"]["head_size"]
    io, held = session.io_binding(), []
    for name in pasts:  # the buffers hold the whole run; present.* are the same memory (written in place)
        value = ort.OrtValue.ortvalue_from_numpy(np.zeros((1, kv_heads, prompt + STEPS + 8, head_dim), np.float32))
        io.bind_ortvalue_input(name, value)
        io.bind_ortvalue_output(name.replace("past_key_values.", "present."), value)
        held.append(value)
    position, times = 0, []
    for chunk in [prompt] + [1] * STEPS:
        io.bind_cpu_input("input_ids", np.full((1, chunk), 100 + position % 50, np.int64))
        if "cache_position" in inputs:  # ours: the stream's position, the whole window, the last logits only
            io.bind_cpu_input("cache_position", np.array([position], np.int64))
            for name, value in (("attention_window", 0), ("logits_to_keep", 1)):
                if name in inputs:
                    io.bind_cpu_input(name, np.array(value, np.int64))
        else:  # onnxruntime-genai's: the attention mask's length is the total length
            io.bind_cpu_input("attention_mask", np.ones((1, position + chunk), np.int64))
        io.bind_output("logits")
        t0 = time.perf_counter()
        session.run_with_iobinding(io)
        times.append(time.perf_counter() - t0)
        position += chunk
    return statistics.median(times[1 + WARMUP:])


def measure_ring(path: Path, position: int, window: int, runs: int = 60) -> float:
    """Median seconds of one decode step of a bundle's ring graph (`model.ort.onnx`) at `position`, reading the sinks
    and the last `window` rows of a cache of random rows (its timing does not depend on their values)."""
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    _, kv_heads, _, head_dim = inputs["past_key_values.0.key"].shape
    rng, capacity = np.random.default_rng(0), position + 100
    feeds = {"input_ids": np.array([[100]], np.int64), "cache_position": np.array([position], np.int64),
             "attention_window": np.array(window, np.int64), "logits_to_keep": np.array(1, np.int64),
             "attention_pages": np.array(0, np.int64)}
    for name in inputs:
        if name.startswith("past_key_values."):
            feeds[name] = rng.standard_normal((1, kv_heads, capacity, head_dim), dtype=np.float32)
        elif name.startswith("key_bounds."):  # a bundle with pages: their bounds (read with pages 0 too)
            page = int(json.loads((path.parent / "manifest.json").read_text())["sections"]["decoder"]["page"])
            feeds[name] = rng.standard_normal((1, kv_heads, (capacity - 4) // page, 2, head_dim), dtype=np.float32)
    io, held = session.io_binding(), []
    for name in inputs:
        held.append(ort.OrtValue.ortvalue_from_numpy(feeds[name]))
        io.bind_ortvalue_input(name, held[-1])
    for out in session.get_outputs():
        io.bind_output(out.name)
    times = []
    for _ in range(WARMUP + runs):
        t0 = time.perf_counter()
        session.run_with_iobinding(io)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[WARMUP:])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precision", choices=["fp32", "int4"], default="int4")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--graph", action="append", default=[], metavar="NAME=PATH", help="another graph to time")
    parser.add_argument("--prompt", type=int, nargs="+", default=[PROMPT],
                        help="prompt tokens before the timed steps (several: each graph at each, in turns)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="time only these of the default graphs")
    parser.add_argument("--ring", type=int, nargs="+", default=[], metavar="W",
                        help="also time the bundle's ring graph (model.ort.onnx) reading the sinks + W rows")
    parser.add_argument("--position", type=int, default=1000, help="the ring graph's stream position (--ring)")
    parser.add_argument("--one-ring", type=Path, help=argparse.SUPPRESS)  # the child: --position, --ring W
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # the child: time this graph, print seconds
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, args.prompt[0])))
        return
    if args.one_ring:
        print(json.dumps(measure_ring(args.one_ring, args.position, args.ring[0])))
        return
    todo = graphs(args.precision)
    if args.only:
        unknown = sorted(set(args.only) - set(todo))
        if unknown:
            parser.error(f"--only: expected some of {', '.join(todo)}, found {', '.join(unknown)}")
        todo = {name: path for name, path in todo.items() if name in args.only}
    todo.update(dict(item.split("=", 1) for item in args.graph))
    missing = [f"{name}: {path}" for name, path in todo.items() if not Path(path).is_file()]
    if missing:
        sys.exit("missing (generation_cpu.py prepare [--peers]): " + "; ".join(missing))
    cells = {f"{name} | fast path, after {prompt} prompt tokens": ["--one", str(todo[name]), "--prompt", str(prompt)]
             for name in todo for prompt in args.prompt}
    ring = GEN / f"smollm2_{args.precision}.edgeattn" / "model.ort.onnx"
    cells.update({f"edgeattn | ring graph, position {args.position}, window {w}":
                  ["--one-ring", str(ring), "--position", str(args.position), "--ring", str(w)] for w in args.ring})
    runs: dict[str, list[float]] = {cell: [] for cell in cells}
    for r in range(args.rounds):
        for cell in list(cells) if r % 2 == 0 else list(cells)[::-1]:
            out = subprocess.run([sys.executable, __file__, *cells[cell]], capture_output=True, text=True, check=True)
            runs[cell].append(1e3 * json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}/{args.rounds} {cell}: {runs[cell][-1]:.3f} ms", file=sys.stderr, flush=True)
    print(f"| graph ({args.precision}) | step | median ms a decode step | rounds |\n|---|---|---|---|")
    for cell, times in runs.items():
        print(f"| {cell} | {statistics.median(times):.3f} | {', '.join(f'{t:.2f}' for t in times)} |")

if __name__ == "__main__":
    main()
