"""The generation service under load on loopback: correctness at 64 concurrent streams, and continuous batching.

Starts `edgeattn serve BUNDLE` as a child process and drives it with an asyncio HTTP client in this process
(server-sent events from /v1/completions, greedy):

1. correctness: every prompt served alone first (the reference), then STREAMS concurrent streams, each with its
   own prompt, sending REQUESTS short requests (TOKENS_SHORT new tokens) in all; every answer must equal the
   same request served alone (text and token count) and end with a finish reason and `data: [DONE]`; nothing
   may be lost.
2. batching: a server with 16 slots; one request at a time, then 16 concurrent streams (rounds alternate, so
   a shared machine's changing load falls on both alike): total generated tokens/s and the inter-token
   latency at the client (time between two chunks of one stream), p50/p99. Around every round it reads the
   server's step profile (/v2/models/dec/stats): ms per scheduler iteration by phase (model calls, sampling,
   detokenizing, slot moves, handing events to the event loop), the iterations' p50/p99, how many carried a
   prefill chunk; and the CPU seconds of the server, of its event-loop thread and of this client, and the load
   average (all in `--json`).
3. steps: in this process, no server: the model call of a decode step at 1..16 rows and of a one-row prefill
   chunk of 1..64 tokens (the curve the server's prefill-chunk default is read from).

    python benchmarks/serve_generate.py                      # the tiny random decoder (quick)
    python benchmarks/serve_generate.py --requests 1000      # quicker
    python benchmarks/serve_generate.py --bundle smollm2.edgeattn --requests 2000 --batch-tokens 48
    python benchmarks/serve_generate.py --bundle smollm2.edgeattn --skip correctness --rounds 2 --batch-tokens 32 \
        --batch-requests 2 --window-max 512 [--prefill-in-step 32] --json out.json

Only 127.0.0.1 is contacted. Every loop is bounded (requests, tokens, start-up timeout).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
from server_process import HOST, free_port, start_serve  # noqa: E402  (beside this script)

WORDS = ("river stone light heat window sink token cache orbit maple copper signal harbor lantern meadow "
         "quartz ember glacier violet thunder").split()


def start_server(bundle: Path, port: int, slots: int, threads: int, max_queue: int,
                 prefill_in_step: int = 0, prefill_chunk: int = 0, window_max: int = 0) -> subprocess.Popen:
    args = [str(bundle), "--name", "dec", "--slots", str(slots), "--max-queue", str(max_queue),
            "--prefill-in-step", str(prefill_in_step)]
    if prefill_chunk:
        args += ["--prefill-chunk", str(prefill_chunk)]
    if window_max:  # a smaller ring than the bundle's (the child reads its settings from the environment too)
        os.environ["EDGEATTN_SERVE_WINDOW_MAX"] = str(window_max)
    return start_serve(args, port, threads, ready_s=300)


def server_stats(url: str) -> dict:
    """The decoder's statistics (slot moves and the scheduler's step profile)."""
    with urllib.request.urlopen(url + "/v2/models/dec/stats", timeout=30) as r:
        return json.loads(r.read())["model_stats"][0]


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """CPU time (user + system) of a process, or of one of its threads."""
    path = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


class Probe:
    """What the server and this client did during one round: the step profile's totals and iterations, CPU
    seconds of the server (all threads; its event-loop thread alone) and of this client process, load average."""

    def __init__(self, url: str, pid: int) -> None:
        self.url, self.pid = url, pid
        self.stats = server_stats(url)
        self.server_cpu, self.loop_cpu = cpu_seconds(pid), cpu_seconds(pid, pid)
        self.client_cpu, self.load = time.process_time(), load_average()

    def result(self) -> dict:
        after, before = server_stats(self.url), self.stats
        p0, p1 = before["profile"], after["profile"]
        iterations = p1["iterations"] - p0["iterations"]
        phases = {k: 1e3 * (p1["seconds"][k] - p0["seconds"][k]) / max(iterations, 1) for k in p1["seconds"]}
        recent = [r for r in p1["recent"] if r[0] > p0["iterations"]]

        def pct(rows: list, col: int, q: float) -> float:
            return float(np.percentile([r[col] for r in rows], q)) if rows else float("nan")

        decode = [r for r in recent if r[1] > 0]
        plain = [r for r in decode if r[2] == 0]  # decode steps that carried no prefill chunk
        return {"iterations": iterations, "ms_per_iteration": phases,
                "iteration_ms_p50": pct(decode, 3, 50), "iteration_ms_p99": pct(decode, 3, 99),
                "decode_model_ms_p50": pct(plain, 4, 50), "decode_model_ms_p99": pct(plain, 4, 99),
                "iterations_with_prefill": sum(1 for r in decode if r[2]), "decode_iterations": len(decode),
                "rows_mean": float(np.mean([r[1] for r in decode])) if decode else 0.0,
                "slot_moves": after["slot_moves"] - before["slot_moves"],
                "server_cpu_s": cpu_seconds(self.pid) - self.server_cpu,
                "server_loop_thread_cpu_s": cpu_seconds(self.pid, self.pid) - self.loop_cpu,
                "client_cpu_s": time.process_time() - self.client_cpu,
                "loadavg": [self.load, load_average()]}


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def prompts(n: int, seed: int = 0) -> list[str]:
    """n distinct prompts of 6-12 words."""
    rng = np.random.default_rng(seed)
    return [f"{i}: " + " ".join(rng.choice(WORDS, size=int(rng.integers(6, 13)))) for i in range(n)]


class Answer:
    def __init__(self) -> None:
        self.text, self.finish, self.done, self.tokens = "", None, False, None
        self.times: list[float] = []  # arrival of each chunk that carried text or the finish
        self.start = time.perf_counter()


async def complete(session, url: str, prompt: str, max_tokens: int) -> Answer:
    body = {"model": "dec", "prompt": prompt, "temperature": 0, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    answer = Answer()
    async with session.post(url + "/v1/completions", json=body) as response:
        if response.status != 200:
            answer.finish = f"http {response.status}"
            return answer
        async for raw in response.content:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                answer.done = True
                break
            doc = json.loads(data)
            if doc.get("usage"):
                answer.tokens = doc["usage"]["completion_tokens"]
            if doc["choices"]:
                choice = doc["choices"][0]
                answer.text += choice["text"]
                if choice["text"] or choice["finish_reason"]:
                    answer.times.append(time.perf_counter())
                answer.finish = choice["finish_reason"] or answer.finish
    return answer


async def correctness(url: str, n_streams: int, n_requests: int, max_tokens: int) -> dict:
    import aiohttp

    texts = prompts(n_streams)
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        alone = {}
        for p in texts:
            a = await complete(session, url, p, max_tokens)
            alone[p] = (a.text, a.tokens)
        counts = {"sent": 0, "ok": 0, "mismatch": 0, "lost": 0}
        per_stream = [n_requests // n_streams + (i < n_requests % n_streams) for i in range(n_streams)]

        async def stream(i: int) -> None:
            for k in range(per_stream[i]):
                p = texts[(i + k) % n_streams]  # each stream its own prompt at any moment, slots reused
                counts["sent"] += 1
                try:
                    a = await complete(session, url, p, max_tokens)
                except Exception:
                    counts["lost"] += 1
                    continue
                if not a.done or a.finish not in ("stop", "length"):
                    counts["lost"] += 1
                elif (a.text, a.tokens) != alone[p]:
                    counts["mismatch"] += 1
                else:
                    counts["ok"] += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(stream(i) for i in range(n_streams)))
        counts["seconds"] = time.perf_counter() - t0
        counts["tokens"] = sum(alone[texts[(i + k) % n_streams]][1] for i in range(n_streams)
                               for k in range(per_stream[i]))
    return counts


async def batching(url: str, concurrency: int, requests_each: int, max_tokens: int) -> dict:
    import aiohttp

    texts = prompts(concurrency, seed=1)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600),
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        answers: list[Answer] = []

        async def client(i: int) -> None:
            for k in range(requests_each):
                answers.append(await complete(session, url, texts[(i + k) % concurrency], max_tokens))

        t0 = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(concurrency)))
        seconds = time.perf_counter() - t0
    gaps = np.concatenate([np.diff(a.times) for a in answers if len(a.times) > 1] or [np.zeros(0)])
    ttft = np.array([a.times[0] - a.start for a in answers if a.times])
    tokens = sum(a.tokens or 0 for a in answers)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "itl_p50_ms": 1e3 * float(np.percentile(gaps, 50)), "itl_p99_ms": 1e3 * float(np.percentile(gaps, 99)),
            "ttft_p50_ms": 1e3 * float(np.percentile(ttft, 50)), "errors": sum(not a.done for a in answers)}


def tiny_bundle(folder: Path) -> Path:
    """The tests' tiny random decoder (SmolLM2's tokenizer), exported and built into `folder`."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from decoder_fixtures import SINKS, WINDOW_MAX, tiny_llama

    from edgeattn.bundle.build import BuildConfig, build
    from edgeattn.decoder.export import DecoderExportConfig, export_decoder_model

    model, tok = tiny_llama()
    onnx_path = export_decoder_model(model, tok, folder / "tiny_dec.onnx",
                                     DecoderExportConfig(sinks=SINKS, window_max=WINDOW_MAX))
    return build(onnx_path, BuildConfig(target="cpu", seq=(1, 1, 32), dims=(("cache", (8, 52, 52)),))).path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, help="a decoder bundle [default: the tiny random decoder, built here]")
    ap.add_argument("--streams", type=int, default=64, help="concurrent streams in the correctness run")
    ap.add_argument("--requests", type=int, default=10_000, help="requests in all in the correctness run")
    ap.add_argument("--short-tokens", type=int, default=8, help="new tokens per correctness request")
    ap.add_argument("--slots", type=int, default=8, help="server slots in the correctness run")
    ap.add_argument("--concurrency", type=int, default=16, help="concurrent streams in the batching run")
    ap.add_argument("--batch-tokens", type=int, default=64, help="new tokens per batching request")
    ap.add_argument("--batch-requests", type=int, default=2, help="requests per stream in each batched round")
    ap.add_argument("--rounds", type=int, default=2, help="alternating single/batched rounds")
    ap.add_argument("--prefill-in-step", type=int, default=0,
                    help="server --prefill-in-step: prompts up to this long are prefilled inside the decode steps")
    ap.add_argument("--prefill-chunk", type=int, default=0, help="server --prefill-chunk [default: its own]")
    ap.add_argument("--window-max", type=int, default=0, help="ring rows per slot [default: the bundle's]")
    ap.add_argument("--threads", type=int, default=0, help="server ONNX Runtime threads [default: its own]")
    ap.add_argument("--curve-repeats", type=int, default=7, help="passes of the in-process step-cost curve")
    ap.add_argument("--json", type=Path, help="write the batching rounds (with the server's profile) here")
    ap.add_argument("--skip", choices=["correctness", "batching", "steps"], action="append", default=[])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bundle = args.bundle or tiny_bundle(Path(tmp))
        print(f"bundle {bundle}", flush=True)
        if "correctness" not in args.skip:
            port = free_port()
            proc = start_server(bundle, port, args.slots, args.threads, max_queue=max(256, args.streams),
                                prefill_in_step=args.prefill_in_step)
            try:
                c = asyncio.run(correctness(f"http://{HOST}:{port}", args.streams, args.requests,
                                            args.short_tokens))
            finally:
                stop_server(proc)
            print(f"correctness: {args.streams} concurrent streams, {args.slots} slots, prefill in step up to "
                  f"{args.prefill_in_step} tokens, {c['sent']} requests of "
                  f"{args.short_tokens} tokens: {c['ok']} equal to the request served alone, {c['mismatch']} "
                  f"different, {c['lost']} lost; {c['seconds']:.1f} s, {c['sent'] / c['seconds']:.1f} req/s, "
                  f"{c['tokens'] / c['seconds']:.1f} tokens/s", flush=True)
        if "batching" not in args.skip:
            port = free_port()
            proc = start_server(bundle, port, args.concurrency, args.threads, max_queue=256,
                                prefill_in_step=args.prefill_in_step, prefill_chunk=args.prefill_chunk,
                                window_max=args.window_max)
            url = f"http://{HOST}:{port}"
            single, batched = [], []
            try:
                asyncio.run(batching(url, 1, 1, 8))  # warm-up
                for r in range(args.rounds):
                    for runs, concurrency, each in ((single, 1, max(2, args.batch_requests)),
                                                    (batched, args.concurrency, args.batch_requests)):
                        probe = Probe(url, proc.pid)
                        runs.append(asyncio.run(batching(url, concurrency, each, args.batch_tokens)))
                        runs[-1]["server"] = probe.result()
                    print(f"round {r + 1}: single {brief(single[-1])}\n         batched {brief(batched[-1])}",
                          flush=True)
            finally:
                stop_server(proc)
            summary = report(single, batched, args)
            if args.json:
                args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                 "single": single, "batched": batched, "summary": summary},
                                                indent=1))
        if "steps" not in args.skip:
            step_curve(bundle, args)


def brief(run: dict) -> str:
    keys = ("tokens_per_s", "itl_p50_ms", "itl_p99_ms", "ttft_p50_ms", "errors")
    srv = run["server"]
    return (" ".join(f"{k}={run[k]:.1f}" for k in keys) + f" | server: iteration p50/p99 {srv['iteration_ms_p50']:.0f}/"
            f"{srv['iteration_ms_p99']:.0f} ms, decode call p50 {srv['decode_model_ms_p50']:.0f} ms, rows "
            f"{srv['rows_mean']:.1f}, {srv['iterations_with_prefill']}/{srv['decode_iterations']} with a prefill "
            f"chunk; cpu s server {srv['server_cpu_s']:.1f} (loop thread {srv['server_loop_thread_cpu_s']:.1f}) "
            f"client {srv['client_cpu_s']:.1f}; load {srv['loadavg'][0]:.1f}-{srv['loadavg'][1]:.1f}")


def step_curve(bundle: Path, args) -> None:
    """In this process, no server: the model call of a decode step at 1..16 rows and of a one-row prefill chunk
    of 1..64 tokens (streams at position 16), interleaved over `--curve-repeats` passes, median ms."""
    from edgeattn.bundle.folder import open_bundle
    from edgeattn.runtime.generation.decoder_bundle import DecoderModel

    model = DecoderModel(open_bundle(bundle), window_max=args.window_max or None, threads=args.threads).activate()
    cache = model.new_cache(args.concurrency)
    shapes = [("rows", n) for n in sorted({1, 2, 4, 8, args.concurrency})] + \
             [("chunk", n) for n in (1, 2, 4, 8, 16, 32, 64) if n <= model.layout.window_max]
    times: dict = {shape: [] for shape in shapes}
    load = [load_average()]
    for _ in range(args.curve_repeats + 1):  # the first pass warms up and is dropped
        for kind, n in shapes:
            rows, width = (n, 1) if kind == "rows" else (1, n)
            cache.positions[:] = 16
            before = time.perf_counter()
            model.step(cache, list(range(rows)), np.ones((rows, width), dtype=np.int64), 0)
            times[(kind, n)].append(time.perf_counter() - before)
    load.append(load_average())
    one = float(np.median(times[("rows", 1)][1:]))
    print(f"\nmodel call per step (median of {args.curve_repeats}, load {load[0]:.1f}-{load[1]:.1f}):\n"
          "| step | ms | x one-row decode step |\n|---|---|---|")
    for kind, n in shapes:
        ms = 1e3 * float(np.median(times[(kind, n)][1:]))
        label = f"decode, {n} rows" if kind == "rows" else f"prefill chunk, {n} tokens"
        print(f"| {label} | {ms:.1f} | {ms / 1e3 / one:.2f} |")
    model.deactivate()


def report(single: list[dict], batched: list[dict], args) -> dict:
    def total(runs: list[dict], key: str) -> float:
        return sum(r[key] for r in runs)

    s_tps = total(single, "tokens") / total(single, "seconds")
    b_tps = total(batched, "tokens") / total(batched, "seconds")
    s_p99 = float(np.median([r["itl_p99_ms"] for r in single]))
    b_p99 = float(np.median([r["itl_p99_ms"] for r in batched]))
    print("\n| mode | tokens/s | ITL p50 | ITL p99 | TTFT p50 | errors |\n|---|---|---|---|---|---|")
    for name, runs, tps in (("one request at a time", single, s_tps),
                            (f"{args.concurrency} concurrent streams", batched, b_tps)):
        p50 = float(np.median([r["itl_p50_ms"] for r in runs]))
        p99 = float(np.median([r["itl_p99_ms"] for r in runs]))
        ttft = float(np.median([r["ttft_p50_ms"] for r in runs]))
        print(f"| {name} | {tps:.1f} | {p50:.1f} ms | {p99:.1f} ms | {ttft:.0f} ms | {int(total(runs, 'errors'))} |")
    print(f"\n(prefill in step up to {args.prefill_in_step} tokens)")
    print(f"throughput {b_tps / s_tps:.2f}x one-request-at-a-time (target >= 3x); p99 ITL {b_p99 / s_p99:.2f}x "
          f"the single stream's (target <= 2x)")
    print("\nserver, ms per scheduler iteration (mean over the rounds):\n| phase | one at a time | "
          f"{args.concurrency} streams |\n|---|---|---|")
    for phase in single[0]["server"]["ms_per_iteration"]:
        s_ms = np.mean([r["server"]["ms_per_iteration"][phase] for r in single])
        b_ms = np.mean([r["server"]["ms_per_iteration"][phase] for r in batched])
        print(f"| {phase} | {s_ms:.2f} | {b_ms:.2f} |")
    return {"tokens_per_s_ratio": b_tps / s_tps, "itl_p99_ratio": b_p99 / s_p99, "single_tokens_per_s": s_tps,
            "batched_tokens_per_s": b_tps, "single_itl_p99_ms": s_p99, "batched_itl_p99_ms": b_p99}


if __name__ == "__main__":
    main()
