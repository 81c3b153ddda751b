"""The GPU decode step (runtime/cuda/decode_step.py) on the H200: correctness, then time a token at batch 1 and
64, context 8,192 (and 1,024 at batch 1), windows full / 1024 / 256, per compile mode; Hugging Face `generate`
with a static cache and the earlier TorchDecoderModel in the same run (generation_h200.decode_speed).

    python benchmarks/cuda_step_h200.py [--out results.json] [--modes none,layers,linked,whole,fused,fused:nopdl]
        [--parts correctness,speed,backend,prefill,parity,peers,hf,fused,tiles,profile] [--smoke]

Mode suffixes turn one change of the fused step off for comparison in the same run: ":nopdl" (no programmatic
dependent launch, EDGEATTN_PDL=0), ":reduce" (split attention merged by a reduce kernel, EDGEATTN_SPLIT_MERGE=kernel);
":t16" / ":t32" try tl.dot tiles of 16 / 32 streams above batch 4;
`--parts profile` lists each mode's kernels by GPU time (torch.profiler).

`--parts fused` checks the fused step (hand-written Triton kernels) against the eager step on the 30-layer shape:
logits and greedy tokens over 64 steps, a wrapping ring at a window below the ring, batch 4 with staggered streams.

SmolLM2-135M's shape with random weights (speed does not depend on them). Times are CUDA-event medians of graph
replays (GPU time a step) and, separately, the host's wall time a step including the input copies.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from generation_h200 import decode_speed, smollm2_shaped  # noqa: E402

from edgeattn.plugins.kernels.cached_decode import cached_decode_splits  # noqa: E402
from edgeattn.runtime.cuda.decode_step import DecodeGraph, PackedDecoder, decode_logits  # noqa: E402
from edgeattn.runtime.cuda.sampling import DeviceSampling  # noqa: E402
from edgeattn.runtime.generation.sampling import SamplingConfig  # noqa: E402


def replay_ms(graph, n=200):
    """Median over 5 rounds of the mean GPU time of n back-to-back replays (CUDA events)."""
    graph.replay()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / n)
    return statistics.median(times)


def host_ms(step, ids, pos, window, n=200):
    """Wall time a step as a caller sees it: input copies, replay, and the token ids back on the host."""
    step(ids, pos, window).cpu()
    t0 = time.perf_counter()
    for _ in range(n):
        step(ids, pos, window).cpu()
    return 1e3 * (time.perf_counter() - t0) / n


def correctness(device, smoke):
    """Graph replays (each compile mode) equal eager steps token for token, batch 4, a wrapping ring."""
    model = smollm2_shaped(torch.bfloat16, device, layers=2 if smoke else 4)  # semantics, not speed: 4 layers
    w = PackedDecoder.from_hf(model, sinks=4, window_max=64)
    out = {}
    tokens = torch.randint(3, 40000, (4, 100), device=device)
    for mode in ("none", "layers", "linked", "whole", "fused"):
        k1, v1 = w.new_cache(4)
        k2, v2 = w.new_cache(4)
        graph = DecodeGraph(w, k2, v2, batch=4, splits=1, compile=mode)
        same, t0 = 0, time.perf_counter()
        with torch.no_grad():
            for p in range(100):
                pos = torch.full((4,), p, device=device)
                want = decode_logits(w, tokens[:, p], pos, torch.tensor(32, device=device), k1, v1).argmax(-1)
                same += int(torch.equal(want, graph(tokens[:, p], pos, 32)))
        out[mode] = {"steps_equal": same, "of": 100, "cache_max_abs_diff": float((k1[-1] - k2[-1]).abs().max()),
                     "seconds": time.perf_counter() - t0}
        print("correctness", mode, out[mode], flush=True)
    return out


def fused_check(device, smoke, steps=64):
    """The fused step's graph (logits, and greedy) against the eager step (decode_logits), 30 layers, bf16: the
    largest logit difference relative to the largest logit, and the steps whose greedy tokens agree (inputs: the
    eager step's own greedy tokens, so one disagreement does not change the later inputs)."""
    model = smollm2_shaped(torch.bfloat16, device, layers=2 if smoke else 30)
    out = {}
    for window_max, window in ((32, 16), (256, 0), (256, 64)):
        w = PackedDecoder.from_hf(model, sinks=4, window_max=window_max)
        caches = [w.new_cache(4) for _ in range(3)]
        logits_step = DecodeGraph(w, *caches[1], batch=4, splits=0, compile="fused", greedy=False)
        greedy_step = DecodeGraph(w, *caches[2], batch=4, splits=0, compile="fused", greedy=True)
        tok = torch.randint(3, 40000, (4,), device=device)
        worst, same, same_logits_argmax = 0.0, 0, 0
        with torch.no_grad():
            for p in range(steps):
                pos = torch.tensor([p, p + 7, p + 30, max(p - 3, 0)], device=device)
                want = decode_logits(w, tok, pos, torch.tensor(window, device=device), *caches[0])
                got = logits_step(tok, pos, window).clone()
                ids = greedy_step(tok, pos, window)
                worst = max(worst, float((got.float() - want.float()).abs().max() / want.float().abs().max()))
                same += int(torch.equal(ids, want.argmax(-1)))
                same_logits_argmax += int(torch.equal(got.argmax(-1), want.argmax(-1)))
                tok = want.argmax(-1)
        row = {"window_max": window_max, "window": window, "steps": steps, "logits_max_rel_diff": worst,
               "greedy_steps_equal": same, "logits_argmax_steps_equal": same_logits_argmax,
               "cache_max_abs_diff": float((caches[0][0][-1].float() - caches[2][0][-1].float()).abs().max())}
        out[f"ring{window_max}-w{window}"] = row
        print("fused", row, flush=True)
    return out


def tile_sweep(device, smoke):
    """GPU time of the fused step with other tiles (fused_decode.FUSED_TILES), batch 1 and 64, context 8,192,
    W=1024: which tiles the table should hold."""
    import dataclasses

    from edgeattn.plugins.kernels import fused_decode as fk

    model = smollm2_shaped(torch.bfloat16, device, layers=2 if smoke else 30)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    table, rows = fk.FUSED_TILES, []
    small = {"block_n_hidden": 16, "block_n_inter": 32, "warps": 4}  # more programs: each a smaller share
    for batch, changes in ((1, [{}, {"block_n_hidden": 8}, {"block_n_inter": 8}, {"block_n_inter": 32}, {"pairs": 4},
                                {"block_n_vocab": 128}, {"block_k": 64}]),
                           (64, [{}, dict(small, block_b=16), dict(small, block_b=16, pairs=16),
                                 dict(small, block_b=32, pairs=16), dict(small, block_b=64, pairs=16, warps=8),
                                 {"block_b": 16, "block_n_hidden": 32, "block_n_inter": 64, "pairs": 16, "warps": 4},
                                 {"block_b": 32, "block_n_hidden": 32, "block_n_inter": 64, "pairs": 16, "warps": 4}])):
        w = PackedDecoder.from_hf(model, sinks=4, window_max=8192)
        keys, values = w.new_cache(batch)
        ids, pos = torch.full((batch,), 5, dtype=torch.int64), torch.full((batch,), 8192, dtype=torch.int64)
        splits = cached_decode_splits(batch * w.shape.kv_heads, 4, 1024, sms)
        for change in changes:
            tiles = dataclasses.replace(fk.fused_tiles(batch), **change)
            fk.FUSED_TILES = ((1 << 30, tiles),)
            try:
                step = DecodeGraph(w, keys, values, batch=batch, splits=splits, compile="fused")
                step(ids, pos, 1024)
                row = {"batch": batch, "change": change, "graph_replay_ms": replay_ms(step.graph)}
            except Exception as exc:  # a tile the compiler refuses: say so, keep sweeping
                row = {"batch": batch, "change": change, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            finally:
                fk.FUSED_TILES = table
            print("tiles", json.dumps(row), flush=True)
            rows.append(row)
        del keys, values
        torch.cuda.empty_cache()
    return rows


def hf_parity(device, smoke, n_new=128):
    """Greedy tokens of the graph step (fp32 and bf16, window >= context) against Hugging Face generate."""
    rows = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = smollm2_shaped(dtype, device, layers=2 if smoke else 30)
        prompt = torch.randint(3, 40000, (1, 32), device=device)
        with torch.no_grad():
            hf = model.generate(prompt, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                                pad_token_id=0)[0, 32:].tolist()
            w = PackedDecoder.from_hf(model, sinks=4, window_max=256)
            keys, values = w.new_cache(1)
            step = DecodeGraph(w, keys, values, batch=1, splits=1, compile="layers")
            ids = prompt[0].tolist()
            ours, tok = [], None
            for p, t in enumerate(ids + [None] * (n_new - 1)):
                t = t if t is not None else tok
                tok = int(step(torch.tensor([t], device=device), torch.tensor([p], device=device), 0)[0])
                if p >= len(ids) - 1:
                    ours.append(tok)
        agree = next((i for i, (a, b) in enumerate(zip(ours, hf)) if a != b), len(hf))
        rows[str(dtype)] = {"tokens_equal_prefix": agree, "of": n_new}
        print("parity", dtype, rows[str(dtype)], flush=True)
    return rows


class _mode_env:
    """The environment a mode's suffixes ask for while its graph is captured: ":nopdl" launches without programmatic
    dependent launch (EDGEATTN_PDL=0), ":reduce" merges split attention in a reduce kernel instead of the last split
    program (EDGEATTN_SPLIT_MERGE=kernel); "fused:nopdl:reduce" is the fused step as it was before either."""

    FLAGS = {"nopdl": ("EDGEATTN_PDL", "0"), "reduce": ("EDGEATTN_SPLIT_MERGE", "kernel")}
    # ":t16" / ":t32": batches above 4 take tl.dot tiles of 16 / 32 streams with more, smaller programs
    TILES = {"t16": dict(block_b=16, block_n_hidden=16, block_n_inter=32, block_n_vocab=128, pairs=16, warps=4),
             "t32": dict(block_b=32, block_n_hidden=16, block_n_inter=32, block_n_vocab=128, pairs=16, warps=4)}

    def __init__(self, mode: str) -> None:
        flags = mode.split(":")[1:]
        self.set = dict(self.FLAGS[f] for f in flags if f in self.FLAGS)
        self.tiles = next((self.TILES[f] for f in flags if f in self.TILES), None)
        self.saved, self.saved_tiles = {}, None

    def __enter__(self):
        for k, v in self.set.items():
            self.saved[k] = os.environ.get(k)
            os.environ[k] = v
        if self.tiles is not None:
            from edgeattn.plugins.kernels import fused_decode as fk

            self.saved_tiles = fk.FUSED_TILES
            fk.FUSED_TILES = (fk.FUSED_TILES[0], (1 << 30, fk.FusedTiles(gemv=False, **self.tiles)))

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if self.saved_tiles is not None:
            from edgeattn.plugins.kernels import fused_decode as fk

            fk.FUSED_TILES = self.saved_tiles


def profile_steps(device, smoke, modes):
    """Where a step's GPU time goes: torch.profiler over 20 graph replays, per (batch, mode), the kernels by total
    time (name, count a step, microseconds a step), context 8,192, W=1024."""
    from torch.profiler import ProfilerActivity, profile

    model = smollm2_shaped(torch.bfloat16, device, layers=2 if smoke else 30)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    out = []
    for batch in (1, 64) if not smoke else (1,):
        w = PackedDecoder.from_hf(model, sinks=4, window_max=8192)
        keys, values = w.new_cache(batch)
        for t in keys + values:
            t.normal_()
        ids, pos = torch.full((batch,), 5, dtype=torch.int64), torch.full((batch,), 8192, dtype=torch.int64)
        splits = cached_decode_splits(batch * w.shape.kv_heads, 4, 1024, sms)
        for mode in modes:
            with _mode_env(mode):
                step = DecodeGraph(w, keys, values, batch=batch, splits=splits, compile=mode.split(":")[0])
                step(ids, pos, 1024)
            n = 20
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(n):
                    step.graph.replay()
                torch.cuda.synchronize()
            kernels = {}
            for e in prof.events():
                if e.device_type.name == "CUDA":
                    k = kernels.setdefault(e.name[:90], [0, 0.0])
                    k[0] += 1
                    k[1] += e.device_time
            top = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:14]
            row = {"batch": batch, "mode": mode, "kernels_per_step": sum(c for c, _ in kernels.values()) / n,
                   "kernel_us_per_step": sum(t for _, t in kernels.values()) / n,
                   "graph_replay_ms": replay_ms(step.graph),
                   "top": [[name, c / n, t / n] for name, (c, t) in top]}
            print("profile", json.dumps(row), flush=True)
            out.append(row)
            del step
        del keys, values
        torch.cuda.empty_cache()
    return out


def split_sweep(device, smoke, modes):
    """GPU time of a step at batch 64, context 8,192, per attention split count (the default from
    cached_decode_splits, then 1, 2, 4, 8 programs per stream and kv head), W = 1,024 and 256, per mode."""
    model = smollm2_shaped(torch.bfloat16, device, layers=2 if smoke else 30)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    batch, rows = (4 if smoke else 64), []
    w = PackedDecoder.from_hf(model, sinks=4, window_max=8192)
    keys, values = w.new_cache(batch)
    for t in keys + values:
        t.normal_()
    ids, pos = torch.full((batch,), 5, dtype=torch.int64), torch.full((batch,), 8192, dtype=torch.int64)
    for window in (1024, 256):
        default = cached_decode_splits(batch * w.shape.kv_heads, 4, window, sms)
        for mode in modes:
            for splits in dict.fromkeys((default, 1, 2, 4, 8)):
                with _mode_env(mode):
                    step = DecodeGraph(w, keys, values, batch=batch, splits=splits, compile=mode.split(":")[0])
                    step(ids, pos, window)
                row = {"batch": batch, "window": window, "mode": mode, "splits": splits, "default": splits == default,
                       "graph_replay_ms": replay_ms(step.graph)}
                print("splits", json.dumps(row), flush=True)
                rows.append(row)
                del step
    return rows


def speed(device, smoke, modes, plans: str = ""):
    model = smollm2_shaped(torch.bfloat16, device, layers=2 if smoke else 30)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    rows = []
    plan = [(1, 8192), (1, 1024), (64, 8192)] if not smoke else [(1, 256), (4, 256)]
    if plans:  # "64x8192,1x1024": batch x context
        plan = [tuple(int(v) for v in p.split("x")) for p in plans.split(",")]
    for batch, ctx in plan:
        w = PackedDecoder.from_hf(model, sinks=4, window_max=ctx)
        keys, values = w.new_cache(batch)
        for t in keys + values:
            t.normal_()
        ids = torch.full((batch,), 5, dtype=torch.int64)
        pos = torch.full((batch,), ctx, dtype=torch.int64)  # a full cache (the ring has wrapped)
        for window in (0, 1024, 256) if not smoke else (0, 64):
            live = ctx if window == 0 else min(window, ctx)
            splits = cached_decode_splits(batch * w.shape.kv_heads, 4, live, sms)
            for mode in modes:
                if mode == "whole" and (batch, window) not in ((1, 256), (64, 1024)):
                    continue  # one compilation per split count: a few points only
                t0 = time.perf_counter()
                with _mode_env(mode):  # the launches are captured here, with or without PDL
                    step = DecodeGraph(w, keys, values, batch=batch, splits=splits, compile=mode.split(":")[0])
                    step(ids, pos, window)
                build_s = time.perf_counter() - t0
                gpu = replay_ms(step.graph)
                host = host_ms(step, ids, pos, window)
                row = {"engine": f"edgeattn cuda step ({mode})", "batch": batch, "context": ctx,
                       "window": window or ctx, "splits": splits, "graph_replay_ms": gpu, "host_ms_per_step": host,
                       "tokens_per_s": batch / (host / 1e3), "capture_s": build_s}
                print(json.dumps(row), flush=True)
                rows.append(row)
                del step
            for mode in [m for m in ("layers", "fused") if m in modes and window == 1024]:
                # the same step sampling on the device (top-p 0.9, T 0.8)
                params = DeviceSampling.for_streams(batch, device)
                for r in range(batch):
                    params.set(r, SamplingConfig(temperature=0.8, top_p=0.9, seed=r))
                step = DecodeGraph(w, keys, values, batch=batch, splits=splits, compile=mode, sampling=params)
                step(ids, pos, window)
                gpu, host = replay_ms(step.graph), host_ms(step, ids, pos, window)
                row = {"engine": f"edgeattn cuda step ({mode}, sampled)", "batch": batch, "context": ctx,
                       "window": window, "splits": splits, "graph_replay_ms": gpu, "host_ms_per_step": host,
                       "tokens_per_s": batch / (host / 1e3)}
                print(json.dumps(row), flush=True)
                rows.append(row)
                del step
        del keys, values
        torch.cuda.empty_cache()
    return rows


def backend_steps(device, smoke):
    """The engine's call into the GPU backend (CudaDecoder.step_sample): host work included, batch 1 and 64."""
    from edgeattn.runtime.cuda.backend import CudaDecoder

    model = smollm2_shaped(torch.bfloat16, device, layers=2 if smoke else 30)
    rows = []
    for batch, ctx in ((1, 8192), (64, 8192)) if not smoke else ((1, 256),):
        dec = CudaDecoder.from_hf(model, sinks=4, window_max=ctx)
        cache = dec.new_cache(batch)
        for t in cache.keys + cache.values:
            t.normal_()
        greedy = [SamplingConfig()] * batch
        ids = [[5]] * batch
        for window in (0, 1024, 256):
            cache.positions[:] = ctx
            for _ in range(3):
                dec.step_sample(cache, list(range(batch)), ids, window, greedy)
            n = 200
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                dec.step_sample(cache, list(range(batch)), ids, window, greedy)
            ms = 1e3 * (time.perf_counter() - t0) / n
            row = {"engine": "edgeattn CudaDecoder.step_sample", "batch": batch, "context": ctx,
                   "window": window or ctx, "host_ms_per_step": ms, "tokens_per_s": batch / (ms / 1e3)}
            print(json.dumps(row), flush=True)
            rows.append(row)
        del cache, dec
        torch.cuda.empty_cache()
    return rows


def prefill_ttft(device, smoke):
    """Time to the first token of 2,048-token prompts, batch 1 and 8 (ours: one chunk a stream through
    CudaDecoder.step_sample; Hugging Face: generate with one new token), bf16."""
    from edgeattn.runtime.cuda.backend import CudaDecoder

    model = smollm2_shaped(torch.bfloat16, device, layers=2 if smoke else 30)
    n = 256 if smoke else 2048
    dec = CudaDecoder.from_hf(model, sinks=4, window_max=2 * n)
    rows = []
    for batch in (1, 8):
        prompt = torch.randint(3, 40000, (batch, n), device=device)
        cache = dec.new_cache(batch)

        def ours():
            for r in range(batch):
                cache.reset(r)
                dec.step_sample(cache, [r], prompt[r:r + 1].cpu().numpy(), 0, [SamplingConfig()])

        def hf():
            with torch.no_grad():
                model.generate(prompt, max_new_tokens=1, do_sample=False, pad_token_id=0)

        for name, fn in (("edgeattn CudaDecoder prefill", ours), ("HF generate (1 new token)", hf)):
            for _ in range(2):
                fn()
            torch.cuda.synchronize()
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            row = {"engine": name, "batch": batch, "prompt": n, "ttft_ms": 1e3 * statistics.median(times)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "cuda_step_h200.json"))
    ap.add_argument("--modes", default="none,layers,linked,fused")
    ap.add_argument("--parts", default="correctness,speed,backend,prefill,parity,peers")
    ap.add_argument("--plans", default="", help="the speed part's batch x context pairs, e.g. 64x8192,1x1024")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    torch._dynamo.config.cache_size_limit = 64
    device = torch.device("cuda")
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    parts = {"correctness": lambda: correctness(device, args.smoke),
             "parity": lambda: hf_parity(device, args.smoke),
             "fused": lambda: fused_check(device, args.smoke),
             "tiles": lambda: tile_sweep(device, args.smoke),
             "speed": lambda: speed(device, args.smoke, args.modes.split(","), args.plans),
             "backend": lambda: backend_steps(device, args.smoke),
             "prefill": lambda: prefill_ttft(device, args.smoke),
             "peers": lambda: decode_speed(device, args.smoke),
             "hf": lambda: decode_speed(device, args.smoke, hf_only=True),
             "splits": lambda: split_sweep(device, args.smoke, args.modes.split(",")),
             "profile": lambda: profile_steps(device, args.smoke, args.modes.split(","))}
    for name in args.parts.split(","):
        t = time.perf_counter()
        try:
            result[name] = parts[name]()
        except Exception as exc:  # keep the other parts' numbers
            import traceback

            traceback.print_exc()
            result[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"== {name} {time.perf_counter() - t:.1f}s", flush=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    table = [r for part in ("speed", "backend", "peers", "hf") if isinstance(result.get(part), list)
             for r in result[part] if isinstance(r, dict)]
    print(f"{'engine':44s} {'B':>3s} {'ctx':>5s} {'W':>5s} {'gpu ms':>7s} {'host ms':>8s} {'tok/s':>9s}")
    for r in table:
        print(f"{r['engine'][:44]:44s} {r['batch']:3d} {r['context']:5d} {r['window']:5d} "
              f"{r.get('graph_replay_ms', float('nan')):7.3f} {r.get('host_ms_per_step', r.get('ms_per_step')):8.3f} "
              f"{r['tokens_per_s']:9.0f}")


if __name__ == "__main__":
    main()
