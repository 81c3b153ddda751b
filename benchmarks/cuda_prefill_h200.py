"""Time to first token through the decode engine on the GPU (CudaDecoder + Engine), prompts prefilled together:
2,048-token prompts at batch 1 and 8 arriving at once, against Hugging Face `generate` with a static cache and one
new token, in the same run; and the batched prefill checked against one stream at a time.

    python benchmarks/cuda_prefill_h200.py [--out results.json] [--smoke]

SmolLM2-135M's shape with random weights, bf16. Rows: the engine with `prefill_tokens` 8,192 (8 x 2,048 takes
two steps of 4 streams), 16,384 (the default: one step) and 0 (one chunk a step: the engine before batched
prefill), chunks of 2,048 and 512. A row's time is the median over 5 runs of the wall time from the jobs' arrival
to the last job's first token (the engine's steps, host work included).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from generation_h200 import smollm2_shaped  # noqa: E402

from edgeattn.runtime.cuda.backend import CudaDecoder  # noqa: E402
from edgeattn.runtime.generation.engine import Engine, new_job  # noqa: E402
from edgeattn.runtime.generation.sampling import SamplingConfig  # noqa: E402


def engine_ttft(dec, prompts, *, chunk, budget) -> tuple[float, list[int], int]:
    """(seconds from arrival to the last first token, the first tokens, engine steps)."""
    engine = Engine(dec, slots=len(prompts), prefill_chunk=chunk, window=lambda: 0, deliver=lambda events: None,
                    prefill_tokens=budget)
    jobs = [new_job(dec.layout, p, max_tokens=1, sampling=SamplingConfig()) for p in prompts]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for job in jobs:
        engine.add(job)
    steps = 0
    while not engine.idle():
        engine.step()
        steps += 1
    seconds = time.perf_counter() - t0
    return seconds, [j.tokens[0] if j.tokens else -1 for j in jobs], steps


def median_s(fn, runs=5) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def correctness(dec, n) -> dict:
    """bf16: 8 ragged first chunks and then 8 later chunks in one call each, against one stream a call."""
    rng = np.random.default_rng(0)
    batched, alone = dec.new_cache(8), dec.new_cache(8)
    out = {}
    for name, lengths in (("first chunks", [n, n // 2, 7, n, 300, n // 4, 1, n]),
                          ("later chunks", [n // 2, 33, n, 5, 64, n // 8, 100, 2])):
        chunks = [rng.integers(3, 40000, k) for k in lengths]
        streams = list(range(8))
        got = dec.prefill(batched, streams, chunks, 0)
        want = np.concatenate([dec.prefill(alone, [s], [c], 0) for s, c in zip(streams, chunks)])
        out[name] = {"max_abs_diff": float(np.abs(got - want).max()), "logit_scale": float(np.abs(want).max()),
                     "argmax_equal": int((got.argmax(-1) == want.argmax(-1)).sum()), "of": 8}
        print("correctness", name, out[name], flush=True)
    return out


def ttft(model, dec, n, smoke) -> list[dict]:
    rows = []
    for batch in (1, 8):
        prompt = torch.randint(3, 40000, (batch, n), device="cuda")
        prompts = prompt.cpu().tolist()
        plans = [(n, 8192), (n, 16384), (n, 0), (512, 8192)] if batch > 1 else [(n, 8192), (512, 8192)]
        first = None
        for chunk, budget in plans:
            seconds = median_s(lambda: engine_ttft(dec, prompts, chunk=chunk, budget=budget))
            _, tokens, steps = engine_ttft(dec, prompts, chunk=chunk, budget=budget)
            first = first or tokens
            row = {"engine": "edgeattn engine (CudaDecoder)", "batch": batch, "prompt": n, "chunk": chunk,
                   "prefill_tokens": budget, "steps": steps, "ttft_ms": 1e3 * seconds,
                   "first_tokens_equal_to_first_plan": sum(a == b for a, b in zip(tokens, first))}
            print(json.dumps(row), flush=True)
            rows.append(row)

        def hf(cache):
            with torch.no_grad():
                model.generate(prompt, max_new_tokens=1, do_sample=False, pad_token_id=0, cache_implementation=cache)

        for cache in ("static", "dynamic"):
            try:
                seconds = median_s(lambda: hf(cache))
            except Exception as exc:  # keep the other rows
                print(f"HF {cache}: {type(exc).__name__}: {exc}", flush=True)
                continue
            row = {"engine": f"HF generate ({cache} cache, 1 new token)", "batch": batch, "prompt": n,
                   "ttft_ms": 1e3 * seconds}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "cuda_prefill_h200.json"))
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    n = 256 if args.smoke else 2048
    model = smollm2_shaped(torch.bfloat16, "cuda", layers=2 if args.smoke else 30)
    dec = CudaDecoder.from_hf(model, sinks=4, window_max=2 * n)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    result["correctness"] = correctness(dec, n)
    result["ttft"] = ttft(model, dec, n, args.smoke)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{'engine':40s} {'B':>2s} {'chunk':>5s} {'budget':>6s} {'steps':>5s} {'TTFT ms':>8s}")
    for r in result["ttft"]:
        print(f"{r['engine'][:40]:40s} {r['batch']:2d} {r.get('chunk', 0):5d} {r.get('prefill_tokens', 0):6d} "
              f"{r.get('steps', 0):5d} {r['ttft_ms']:8.1f}")


if __name__ == "__main__":
    main()
