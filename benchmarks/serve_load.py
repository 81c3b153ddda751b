"""Load the KServe v2 service from a second process on loopback: throughput, p50/p99, errors, mix-ups.

Starts `edgeattn serve BUNDLE` as a child process per mode (batch-1 and batched; the modes alternate in
ROUNDS so that a shared machine's changing load falls on both alike), drives each with CLIENTS threads, each an unmodified tritonclient.http client sending REQUESTS requests of its own input
and checking every answer against the bundle run directly in this process (a mix-up is an answer that
matches another client's input rather than its own, or none).

    python benchmarks/serve_load.py BUNDLE --clients 16 --requests 500 --seq 16

Only 127.0.0.1 is ever contacted. Every loop is bounded (requests per client, start-up timeout).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
from server_process import HOST, free_port, start_serve  # noqa: E402  (beside this script)



def start_server(bundle: Path, port: int, max_batch: int, delay_ms: float, threads: int) -> subprocess.Popen:
    return start_serve([str(bundle), "--max-batch", str(max_batch), "--max-queue-delay-ms", str(delay_ms),
                        "--max-queue", "1024"], port, threads)


def client_inputs(bundle, clients: int, seq: int) -> list[dict[str, np.ndarray]]:
    from edgeattn.sample_inputs import make_inputs

    kinds = bundle.manifest.sections.get("dimension_kinds", {})
    sizes = {d: 1 if kinds.get(d) == "batch" else seq for d in bundle.manifest.shape_ranges}
    specs = [s for s in bundle.manifest.inputs if s.role != "window"]
    return [make_inputs(specs, sizes, seed=100 + c) for c in range(clients)]


def references(bundle, feeds: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    from edgeattn.runtime.backends import open_backend

    backend = open_backend(bundle)
    backend.activate()
    window = bundle.manifest.input("window")
    extra = {window.name: np.zeros((), dtype=window.dtype)} if window is not None else {}
    try:
        return [backend.infer({**f, **extra}) for f in feeds]
    finally:
        backend.deactivate()


def run_load(url: str, model: str, feeds, expected, requests: int, tolerance: float) -> dict:
    import tritonclient.http as th

    from edgeattn.runtime.server.kserve import DATATYPES

    latencies: list[list[float]] = [[] for _ in feeds]
    errors, mixups, max_diff = [0] * len(feeds), [0] * len(feeds), [0.0] * len(feeds)
    start = threading.Barrier(len(feeds) + 1)

    def one_client(c: int) -> None:
        client = th.InferenceServerClient(url, connection_timeout=60, network_timeout=60)
        inputs = []
        for name, array in feeds[c].items():
            inputs.append(th.InferInput(name, list(array.shape), DATATYPES[array.dtype.name]))
            inputs[-1].set_data_from_numpy(array)
        start.wait()
        for _ in range(requests):
            t0 = time.perf_counter()
            try:
                result = client.infer(model, inputs)
            except Exception:
                errors[c] += 1
                continue
            latencies[c].append(time.perf_counter() - t0)
            for name, want in expected[c].items():
                got = result.as_numpy(name)
                diff = float(np.max(np.abs(got.astype(np.float64) - want))) if got.shape == want.shape else np.inf
                max_diff[c] = max(max_diff[c], diff)
                if diff > tolerance:
                    mixups[c] += 1
                    break
        client.close()

    threads = [threading.Thread(target=one_client, args=(c,), daemon=True) for c in range(len(feeds))]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join(timeout=1800)
    wall = time.perf_counter() - t0
    return {"requests": len(feeds) * requests, "latencies_ms": np.asarray([x for c in latencies for x in c]) * 1000.0,
            "errors": sum(errors), "mixups": sum(mixups), "max_abs_diff": max(max_diff), "wall_s": wall}


def summarize(phases: list[dict]) -> dict:
    """Rounds of one mode together: throughput = answered / summed wall time; percentiles over all requests."""
    lat = np.concatenate([p["latencies_ms"] for p in phases])
    wall = sum(p["wall_s"] for p in phases)
    return {"requests": sum(p["requests"] for p in phases), "answered": int(lat.size),
            "errors": sum(p["errors"] for p in phases), "mixups": sum(p["mixups"] for p in phases),
            "max_abs_diff": max(p["max_abs_diff"] for p in phases), "wall_s": wall,
            "throughput_rps": lat.size / wall if wall else float("nan"),
            "p50_ms": float(np.percentile(lat, 50)) if lat.size else float("nan"),
            "p99_ms": float(np.percentile(lat, 99)) if lat.size else float("nan")}


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Linux /proc), or NaN elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def server_batches(url: str, model: str) -> float:
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=10) as r:
        stats = json.loads(r.read())["model_stats"][0]
    return stats["inference_count"] / max(1, stats["execution_count"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=500, help="per client")
    parser.add_argument("--seq", type=int, default=16, help="tokens per request")
    parser.add_argument("--max-batch", type=int, default=16, help="the batched mode's max batch")
    parser.add_argument("--delay-ms", type=float, default=2.0, help="the batched mode's max queue delay")
    parser.add_argument("--threads", type=int, default=0, help="server ONNX Runtime threads (0: default)")
    parser.add_argument("--tolerance", type=float, default=1e-3,
                        help="max abs diff from the client's own reference before an answer counts as mixed up")
    parser.add_argument("--modes", default="1,batched", help="comma list: 1 (batch-1), batched")
    parser.add_argument("--rounds", type=int, default=5, help="alternate the modes this many times")
    args = parser.parse_args(argv)
    if min(args.clients, args.requests, args.rounds, args.seq) < 1:
        parser.error("--clients, --requests, --rounds and --seq must be >= 1")

    from edgeattn.bundle.folder import open_bundle

    bundle = open_bundle(args.bundle)
    model = bundle.manifest.name
    feeds = client_inputs(bundle, args.clients, args.seq)
    expected = references(bundle, feeds)
    modes = [1 if m == "1" else args.max_batch for m in args.modes.split(",")]
    servers = []
    try:
        for max_batch in modes:  # all servers up at once; the idle one costs nothing
            port = free_port()
            servers.append((max_batch, f"{HOST}:{port}",
                            start_server(bundle.path, port, max_batch, args.delay_ms, args.threads)))
        phases = {url: [] for _, url, _ in servers}
        cpu = {url: [0.0, 0.0] for _, url, _ in servers}
        # Modes alternate in rounds so that a shared machine's changing load falls on both alike.
        counts = [args.requests // args.rounds + (1 if r < args.requests % args.rounds else 0)
                  for r in range(args.rounds)]
        for count in counts:
            for _, url, proc in servers:
                server_cpu, client_cpu = cpu_seconds(proc.pid), time.process_time()
                phases[url].append(run_load(url, model, feeds, expected, count, args.tolerance))
                cpu[url][0] += cpu_seconds(proc.pid) - server_cpu
                cpu[url][1] += time.process_time() - client_cpu
        rows = []
        for max_batch, url, _ in servers:
            result = summarize(phases[url])
            answered = max(1, result["answered"])
            result["server_cpu_ms_per_request"] = cpu[url][0] * 1000 / answered
            result["client_cpu_ms_per_request"] = cpu[url][1] * 1000 / answered
            result["mean_batch"] = server_batches(url, model)
            result["mode"] = "batch-1" if max_batch == 1 else f"batched (max {max_batch}, {args.delay_ms:g} ms)"
            rows.append(result)
    finally:
        for _, _, proc in servers:
            proc.terminate()
            proc.wait(timeout=60)
    for result in rows:
        print(f"{result['mode']:<26} {result['answered']}/{result['requests']} answered  errors {result['errors']}  "
              f"mixed-up {result['mixups']}  throughput {result['throughput_rps']:.1f} req/s  "
              f"p50 {result['p50_ms']:.1f} ms  p99 {result['p99_ms']:.1f} ms  mean batch {result['mean_batch']:.2f}  "
              f"max |diff| {result['max_abs_diff']:.2g}  cpu ms/request server {result['server_cpu_ms_per_request']:.1f} "
              f"client {result['client_cpu_ms_per_request']:.1f}", flush=True)
    if len(rows) == 2:
        speedup = rows[1]["throughput_rps"] / rows[0]["throughput_rps"]
        print(f"batching: {speedup:.2f}x throughput, p99 {rows[1]['p99_ms']:.1f} ms vs {rows[0]['p99_ms']:.1f} ms "
              f"({'better or equal' if rows[1]['p99_ms'] <= rows[0]['p99_ms'] else 'worse'})")
    print(json.dumps({"bundle": str(args.bundle), "clients": args.clients, "requests_per_client": args.requests,
                      "seq": args.seq, "threads": args.threads, "rounds": args.rounds, "cpu_count": os.cpu_count(),
                      "load_average": os.getloadavg(), "results": rows}))
    bad = sum(r["errors"] + r["mixups"] for r in rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
