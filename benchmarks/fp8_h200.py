"""FP8 on the H200 for the cuda target: FP8 weights (runtime/cuda/fp8.py) and the FP8 KV cache
(runtime/cuda/fp8_cache.py, plugins/kernels/ring_fp8.py), against bf16 in the same run.

    python benchmarks/fp8_h200.py pack --out .fp8pay          # here (CPU): SmolLM2-135M's real weights + token ids
    python benchmarks/fp8_h200.py table kernel --out r1.json   # on the GPU: the choice table, the FP8 ring kernel
    python benchmarks/fp8_h200.py model --payload DIR --out r2.json   # on the GPU: perplexity, agreement, speed
    python benchmarks/fp8_h200.py model --shape llama8b-16 --mode linked --out r3.json   # speed at Llama-3-8B's layers

`pack` writes SmolLM2-135M-Instruct's packed weights in two pieces under 50 MB (one call carries at most 64 MiB):
the packaged model's float weights are dequantized from its GGUF file, so each block of 32 weights is exactly
m + d * q (Q4_1, 4-bit q) or d * q (Q8_0, the embedding), which this codec stores losslessly (checked). It also
writes the token ids the GPU run needs (no tokenizer there): the held-out text (lee.cor: never used for
calibration), 4 calibration documents (lee_background.cor) and 32 prompts (other lee_background documents).

`table` times one [M, K] x [K, N] product per shape and token count, bf16 against FP8 with its activation
quantization, as CUDA graph replays, and prints fp8_table.py's TABLE. `kernel` checks the FP8 ring kernel against
a float64 reference of the dequantized cache and times it against the bf16 kernel. `model`: perplexity on the
held-out text (teacher-forced decode steps: every token reads the cache), greedy agreement with bf16 over 128
tokens on 32 prompts, prefill 8 x 2,048, decode at batch 256 / context 2,048 and batch 64 / context 8,192.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

Q_BLOCK = 32
PIECE_BYTES = 48 * 2**20


# --- pack (CPU) ----------------------------------------------------------------------------------------------
def _encode(w):
    """A bf16 tensor -> the smallest exact record: Q4_1 or Q8_0 blocks of 32 along the rows, else raw."""
    if w.ndim == 2 and w.shape[1] % Q_BLOCK == 0:
        b = w.float().reshape(-1, Q_BLOCK)
        lo, hi = b.min(1, keepdim=True).values, b.max(1, keepdim=True).values
        d, m = ((hi - lo) / 15).half(), lo.half()
        q = ((b - m.float()) / torch.where(d.float() > 0, d.float(), 1)).round().clamp(0, 15)
        if bool(((m.float() + d.float() * q).bfloat16() == b.bfloat16()).all()):
            q = q.to(torch.uint8).reshape(-1, 2)
            return {"kind": "q4_1", "shape": list(w.shape), "q": q[:, 0] | (q[:, 1] << 4), "d": d, "m": m}
        d = (b.abs().max(1, keepdim=True).values / 127).half()
        q = (b / torch.where(d.float() > 0, d.float(), 1)).round().clamp(-128, 127)
        if bool(((d.float() * q).bfloat16() == b.bfloat16()).all()):
            return {"kind": "q8_0", "shape": list(w.shape), "q": q.to(torch.int8), "d": d}
    return {"kind": "raw", "t": w}


def _decode(r):
    if r["kind"] == "raw":
        return r["t"]
    if r["kind"] == "q8_0":
        return (r["d"].float() * r["q"].float()).bfloat16().reshape(r["shape"])
    q = torch.stack([r["q"] & 15, r["q"] >> 4], dim=1).reshape(-1, Q_BLOCK).float()
    return (r["m"].float() + r["d"].float() * q).bfloat16().reshape(r["shape"])


def _nbytes(r) -> int:
    return sum(v.numel() * v.element_size() for v in r.values() if isinstance(v, torch.Tensor))


def pack(out: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from dataclasses import asdict

    from edgeattn import hf_models, text
    from edgeattn.runtime.cuda import fp8_build
    from edgeattn.runtime.cuda.decode_step import PackedDecoder

    folder = hf_models.resolve("smollm2")
    model, tok, _ = hf_models.load(folder, attn_implementation="sdpa", kind="decoder")
    model = model.to(torch.bfloat16)
    packed = PackedDecoder.from_hf(model, sinks=4, window_max=2048)
    pieces, sizes = [{}, {}], [0, 0]
    for name, t in packed.state_dict().items():
        r = _encode(t)
        assert torch.equal(_decode(r).view(torch.int16), t.view(torch.int16)) or r["kind"] == "raw", name
        i = 0 if sizes[0] + _nbytes(r) <= PIECE_BYTES else 1
        pieces[i][name], sizes[i] = r, sizes[i] + _nbytes(r)
    heldout = text.token_stream(tok, text.lee_heldout_documents())
    background = text.lee_documents()
    ids = lambda doc: tok(doc, add_special_tokens=False).input_ids  # noqa: E731
    meta = {"shape": asdict(packed.shape), "rope_scaling": packed.rope_scaling, "model": str(folder),
            "heldout": heldout, "calibration": [ids(d) for d in background[:4]],
            "weight_calibration": [ids(d)[:1024] for d in fp8_build.weight_calibration_texts()[0]],
            "prompts": [ids(d)[:64] for d in background[100:132] if len(ids(d)) >= 64][:32]}
    for i, (piece, name) in enumerate(zip(pieces, "ab")):
        (out / name).mkdir(parents=True, exist_ok=True)
        torch.save(piece, out / name / f"weights_{name}.pt")
        print(f"piece {name}: {len(piece)} tensors, {sizes[i] / 2**20:.1f} MiB")
    (out / "a" / "meta.json").write_text(json.dumps(meta))
    print(f"held-out tokens {len(heldout)}, prompts {len(meta['prompts'])}")


SMOLLM2 = dict(layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, intermediate=1536, vocab=49152, eps=1e-5,
               sinks=4, window_max=2048, scale=0.125)


# Llama-3-8B's layer shapes (the products fp8_table.py measured: 4,096 x 6,144, 4,096 x 28,672, 14,336 x 4,096),
# 16 of its 32 layers so that a bf16 cache of 524,288 rows (batch 256 x 2,048, batch 64 x 8,192) fits beside
# the bf16 and FP8 weights on one GPU; every layer is the same work, so the speed ratios are those of 32 layers
# but for the LM head's share (bf16 in both).
LLAMA8B_16 = dict(layers=16, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=128256,
                  eps=1e-5, sinks=4, window_max=2048, scale=128 ** -0.5)
SHAPES = {"smollm2": (SMOLLM2, 100000.0), "llama8b-16": (LLAMA8B_16, 500000.0)}


def random_payload(device, shape: str = "smollm2"):
    """A model shape (SHAPES) with random weights (speed does not depend on them): meta and tensors. Weights
    are N(0, 1 / K) so activations stay finite through the layers (the FP8 cache calibration needs them)."""
    (s, theta), g = SHAPES[shape], torch.Generator(device=device).manual_seed(0)
    rand = lambda n, k: (torch.randn((n, k), generator=g, device=device) * k ** -0.5).bfloat16()  # noqa: E731
    ones = lambda n: torch.ones(n, device=device, dtype=torch.bfloat16)  # noqa: E731
    h, d, q, kv, f = s["hidden"], s["head_dim"], s["heads"], s["kv_heads"], s["intermediate"]
    t = {"embed": rand(s["vocab"], h), "norm": ones(h),
         "inv_freq": 1.0 / (theta ** (torch.arange(0, d, 2, device=device).float() / d))}
    for i in range(s["layers"]):
        t.update({f"ln1.{i}": ones(h), f"ln2.{i}": ones(h), f"wo.{i}": rand(h, q * d),
                  f"wqkv.{i}": rand((q + 2 * kv) * d, h), f"wgu.{i}": rand(2 * f, h), f"wd.{i}": rand(h, f)})
    calibration = torch.randint(0, s["vocab"], (4, 256), generator=g, device=device).tolist()
    return {"shape": s, "rope_scaling": 1.0, "calibration": calibration}, t


def load_payload(folder: Path | None, device, shape: str = "smollm2"):
    from edgeattn.runtime.cuda.decode_step import DecoderShape, PackedDecoder

    if folder is None:
        meta, tensors = random_payload(device, shape)
    else:
        meta = json.loads((folder / "meta.json").read_text())
        tensors = {}
        for name in ("a", "b"):
            for k, r in torch.load(folder / f"weights_{name}.pt").items():
                tensors[k] = _decode(r).to(device)
    tensors["inv_freq"] = tensors["inv_freq"].float()
    return meta, tensors, lambda t, **kw: PackedDecoder.from_state_dict(
        DecoderShape(**{**meta["shape"], **kw}), t, meta["rope_scaling"])


# --- timing --------------------------------------------------------------------------------------------------
def graph_ms(fn, reps=20, rounds=5):
    """Median over rounds of the mean GPU time of one call, fn captured `reps` times in one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(), fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / reps)
    return statistics.median(times)


def event_ms(fn, rounds=5):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


# --- table ---------------------------------------------------------------------------------------------------
TABLE_SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576), (2048, 2048), (4096, 6144), (4096, 28672),
                (14336, 4096)]
TABLE_TOKENS = [1, 16, 64, 256, 1024, 4096, 16384]
TILES = [(64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 4, 3), (128, 8, 3), (256, 8, 2), (32, 4, 4), (64, 8, 4)]


def table(res: dict) -> None:
    from edgeattn.runtime.cuda import fp8

    dev = torch.device("cuda")
    # torch._scaled_mm's own rules on this build: is an unpadded token count accepted?
    x8 = torch.randn(8, 64, device=dev).to(torch.float8_e4m3fn)
    w8 = torch.randn(32, 64, device=dev).to(torch.float8_e4m3fn)
    try:
        torch._scaled_mm(x8[:5], w8.t(), scale_a=torch.ones(5, 1, device=dev), scale_b=torch.ones(1, 32, device=dev),
                         out_dtype=torch.bfloat16)
        res["scaled_mm_unpadded_m"] = "accepted"
    except RuntimeError as exc:
        res["scaled_mm_unpadded_m"] = str(exc).splitlines()[0][:200]
    speed, detail, worst = {}, {}, 0.0
    for k, n in TABLE_SHAPES:
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) / math.sqrt(k)
        w8, s = fp8.quantize_weight(w, "w")
        wt = (w8, s.reshape(1, -1).contiguous(), None)
        row = []
        for m in TABLE_TOKENS:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            bf = graph_ms(lambda: torch.nn.functional.linear(x, w))
            f8 = graph_ms(lambda: fp8.linear(x, wt))
            ref = x.float() @ w.float().t()
            err = float((fp8.linear(x, wt).float() - ref).norm() / ref.norm())
            worst = max(worst, err)
            row.append(round(bf / f8, 3))
            detail[f"{k}x{n}@{m}"] = {"bf16_ms": round(bf, 5), "fp8_ms": round(f8, 5), "rel_err": round(err, 4)}
        speed[f"{k}x{n}"] = row
        print(f"table {k}x{n}: " + " ".join(f"{m}:{v:.2f}" for m, v in zip(TABLE_TOKENS, row)), flush=True)
    res["table"] = {"tokens": TABLE_TOKENS, "speedup": speed, "detail": detail, "worst_rel_err": worst}
    print("TABLE speedup = " + json.dumps(speed), flush=True)


# --- kernel --------------------------------------------------------------------------------------------------
def kernel(res: dict) -> None:
    from edgeattn.plugins.kernels import ring_ops  # noqa: F401
    from edgeattn.plugins.kernels.cached_decode import cached_decode
    from edgeattn.plugins.kernels.ring_fp8 import dequantize_cache, ring_decode_fp8
    from edgeattn.runtime.cuda import fp8_cache

    dev, out = torch.device("cuda"), {}
    torch.manual_seed(0)
    for (h, hk, d), b, ctx, window in [((9, 3, 64), 8, 1000, 0), ((9, 3, 64), 4, 300, 64), ((32, 8, 128), 4, 2000, 0)]:
        sinks = 4
        kc = torch.randn(b, hk, sinks + 2048, d, device=dev, dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        scale = torch.stack([kc.float().abs().amax(dim=(0, 2, 3)), vc.float().abs().amax(dim=(0, 2, 3))]) / 448
        k8 = fp8_cache.quantize(kc.transpose(1, 2), scale[0]).transpose(1, 2).contiguous()
        v8 = fp8_cache.quantize(vc.transpose(1, 2), scale[1]).transpose(1, 2).contiguous()
        q = torch.randn(b, h, 1, d, device=dev, dtype=torch.bfloat16)
        qs = torch.randn_like(q)
        pos = torch.randint(ctx // 2, ctx, (b,), device=dev)
        win = torch.tensor(window, device=dev)
        ref = ring_ops.ring_attend(q[:, :, 0].double().cpu(), qs[:, :, 0].double().cpu(),
                                   dequantize_cache(k8, scale[0], torch.float64).cpu(),
                                   dequantize_cache(v8, scale[1], torch.float64).cpu(), pos.cpu(), win.cpu(), sinks,
                                   0.0, 0)
        for splits in (None, 1, 4):
            got = ring_decode_fp8(q, qs, k8, v8, scale[0], scale[1], pos, win, sinks=sinks, splits=splits)
            out[f"{h}/{hk}/d{d} b{b} ctx{ctx} w{window} splits{splits}"] = float((got[:, :, 0].double().cpu() - ref)
                                                                               .abs().max())
    res["kernel_max_err"] = out
    print("kernel max err vs float64: " + json.dumps(out), flush=True)
    speed = {}
    for (h, hk, d), b, ctx in [((9, 3, 64), 64, 8192), ((9, 3, 64), 256, 2048), ((32, 8, 128), 64, 8192)]:
        kc = torch.randn(b, hk, 4 + ctx, d, device=dev, dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        k8, v8 = kc.to(torch.float8_e4m3fn), vc.to(torch.float8_e4m3fn)
        one = torch.ones(hk, device=dev)
        q = torch.randn(b, h, 1, d, device=dev, dtype=torch.bfloat16)
        pos = torch.full((b,), ctx + 3, device=dev)
        win = torch.tensor(0, device=dev)
        bf = graph_ms(lambda: cached_decode(q, q, kc, vc, pos, win, sinks=4))
        tiles = {}
        for tile in TILES:
            try:
                tiles[tile] = graph_ms(lambda: ring_decode_fp8(q, q, k8, v8, one, one, pos, win, sinks=4, tile=tile))
            except Exception as exc:  # a tile that does not compile (shared memory) is left out
                print(f"tile {tile}: {type(exc).__name__}", flush=True)
        best = min(tiles, key=tiles.get)
        f8 = tiles[best]
        gb = 2 * b * hk * (ctx + 4) * d
        speed[f"{h}/{hk}/d{d} b{b} ctx{ctx}"] = {"bf16_ms": round(bf, 4), "fp8_ms": round(f8, 4), "best_tile": best,
                                                 "speedup": round(bf / f8, 3),
                                                 "bf16_TBps": round(2 * gb / bf / 1e9, 2),
                                                 "fp8_TBps": round(gb / f8 / 1e9, 2),
                                                 "tiles_ms": {str(k): round(v, 4) for k, v in tiles.items()}}
    res["kernel_speed"] = speed
    print("kernel speed: " + json.dumps(speed), flush=True)


# --- model ---------------------------------------------------------------------------------------------------
def variants(tensors, build, calibration, weight_calibration=None, nearest=False, **shape):
    """name -> PackedDecoder: bf16, FP8 weights, FP8 cache, both (the cache scales calibrated once, on bf16).
    FP8 weights are rounded with error feedback (fp8_gptq, the build's default) from `weight_calibration` (token
    id lists; None: to nearest); `nearest` adds "fp8_weights_nearest" for the quality comparison."""
    from edgeattn.runtime.cuda import fp8, fp8_build
    from edgeattn.runtime.cuda.fp8_gptq import input_hessians, rounder

    layers = build(tensors, **shape).shape.layers
    hessians = input_hessians(build(tensors, **shape), weight_calibration)[0] if weight_calibration else None
    w8 = fp8.fp8_weights(fp8.quantize_state_dict(tensors, layers, rounder(hessians) if hessians else None))
    scales = fp8_build.calibrate(build(tensors, **shape), calibration)
    out = {"bf16": build(tensors, **shape), "fp8_weights": build(w8, **shape),
           "fp8_cache": build({**tensors, "kv_scale": scales}, **shape),
           "fp8_both": build({**w8, "kv_scale": scales}, **shape)}
    if nearest and hessians is not None:
        out["fp8_weights_nearest"] = build(fp8.fp8_weights(fp8.quantize_state_dict(tensors, layers)), **shape)
    return out, scales


def teacher_forced(w, tokens, batch, steps, mode="none"):
    """Logits of `steps` decode steps over `batch` streams fed the given tokens [batch, steps] -> NLL sum, count,
    and the greedy tokens continuing after them are not made here."""
    from edgeattn.runtime.cuda.decode_step import DecodeGraph

    keys, values = w.new_cache(batch)
    g = DecodeGraph(w, keys, values, batch=batch, compile=mode, greedy=False)
    nll, count = 0.0, 0
    for p in range(steps - 1):
        logits = g(tokens[:, p], torch.full((batch,), p, device=tokens.device), 0).float()
        nll += float(torch.nn.functional.cross_entropy(logits, tokens[:, p + 1], reduction="sum"))
        count += batch
    return nll, count


def greedy_run(w, prompts, new_tokens, mode="none"):
    from edgeattn.runtime.cuda.decode_step import DecodeGraph

    b, n = prompts.shape
    keys, values = w.new_cache(b)
    g = DecodeGraph(w, keys, values, batch=b, compile=mode, greedy=True)
    out = []
    for p in range(n + new_tokens - 1):
        tok = prompts[:, p] if p < n else out[-1]
        nxt = g(tok, torch.full((b,), p, device=prompts.device), 0).clone()
        if p >= n - 1:
            out.append(nxt)
    return torch.stack(out[:new_tokens], dim=1)


def decode_ms(w, batch, ctx, mode):
    """GPU ms of one greedy decode step (graph replay) at `batch` streams holding `ctx` tokens each."""
    from edgeattn.runtime.cuda.decode_step import DecodeGraph

    keys, values = w.new_cache(batch)
    for c in keys + values:  # the bytes a step reads do not depend on their values
        c.copy_((torch.randn(c.shape, device=c.device) * 0.5).to(c.dtype))
    g = DecodeGraph(w, keys, values, batch=batch, compile=mode, greedy=True)
    ids = torch.randint(0, w.shape.vocab, (batch,), device=w.device)
    pos = torch.full((batch,), ctx - 1, device=w.device)
    g(ids, pos, 0)
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(20):
            g.graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 20)
    del g, keys, values
    torch.cuda.empty_cache()
    return statistics.median(times)


def prefill_ms(w, streams, length):
    from edgeattn.runtime.cuda import prefill

    keys, values = w.new_cache(streams)
    ids = torch.randint(0, w.shape.vocab, (streams * length,), device=w.device)
    if hasattr(prefill, "prefill_batch"):
        fn = lambda: prefill.prefill_batch(w, ids, [length] * streams, [0] * streams, 0, keys, values,  # noqa: E731
                                           list(range(streams)))
    else:
        fn = lambda: [prefill.prefill_logits(w, ids[i * length:(i + 1) * length], 0, 0, keys, values, i)  # noqa: E731
                      for i in range(streams)]
    with torch.no_grad():
        return event_ms(fn, rounds=3)


def model(res: dict, payload: Path, mode: str, skip: set, shape: str = "smollm2") -> None:
    dev = torch.device("cuda")
    meta, tensors, build = load_payload(payload, dev, shape)
    res["shape"] = meta["shape"] if payload is None else "SmolLM2-135M (payload)"
    skip = skip | ({"quality"} if payload is None else set())  # random weights: speed only
    t0 = time.time()
    weight_calibration = meta.get("weight_calibration")  # token ids of the build's default calibration text
    ws, scales = variants(tensors, build, meta["calibration"], weight_calibration, nearest="quality" not in skip)
    res["fp8_rounding"] = {"method": "gptq" if weight_calibration else "nearest",
                           "calibration_tokens": sum(len(ids) for ids in weight_calibration or [])}
    res["kv_scale_range"] = [float(scales.min()), float(scales.max())]
    if "quality" not in skip:
        quality(res, meta, ws, mode, t0)
    speed = {}
    with torch.no_grad():
        if "prefill" not in skip:
            for name in ("bf16", "fp8_weights"):
                speed[f"prefill 8x2048 {name}"] = round(prefill_ms(ws[name], 8, 2048), 3)
            print(f"speed {json.dumps(speed)} ({time.time() - t0:.0f} s)", flush=True)
        ws.pop("fp8_weights_nearest", None)  # the same products as fp8_weights: quality only
        if "decode" not in skip:
            for name, w in ws.items():
                speed[f"decode b256 ctx2048 {name}"] = round(decode_ms(w, 256, 2048, mode), 4)
            print(f"speed {json.dumps(speed)} ({time.time() - t0:.0f} s)", flush=True)
            del ws
            long, _ = variants(tensors, build, meta["calibration"], weight_calibration, window_max=8192)
            for name, w in long.items():
                speed[f"decode b64 ctx8192 {name}"] = round(decode_ms(w, 64, 8192, mode), 4)
    res["speed_ms"] = speed
    print(f"speed {json.dumps(speed)} ({time.time() - t0:.0f} s)", flush=True)


def quality(res: dict, meta: dict, ws: dict, mode: str, t0: float) -> None:
    dev = torch.device("cuda")
    # perplexity: the held-out text in chunks of 512 tokens, one stream each, teacher-forced decode steps
    chunks = len(meta["heldout"]) // 512
    held = torch.tensor(meta["heldout"][:chunks * 512], device=dev).reshape(chunks, 512)
    ppl = {}
    for name, w in ws.items():
        with torch.no_grad():
            nll, count = teacher_forced(w, held, chunks, 512, mode)
        ppl[name] = round(math.exp(nll / count), 3)
    res["perplexity"] = {**ppl, "tokens": chunks * 511, "text": f"lee.cor (held out), {chunks} chunks of 512 tokens"}
    print(f"perplexity {json.dumps(ppl)} ({time.time() - t0:.0f} s)", flush=True)
    prompts = torch.tensor(meta["prompts"], device=dev)
    with torch.no_grad():
        gen = {name: greedy_run(w, prompts, 128, mode) for name, w in ws.items()}
    agree = {}
    for name in [n for n in gen if n != "bf16"]:
        same = gen[name] == gen["bf16"]
        first = torch.where(same.all(1), 128, (~same).float().argmax(1))
        agree[name] = {"identical_sequences": int(same.all(1).sum()), "of": len(prompts),
                       "mean_tokens_before_first_difference": round(float(first.float().mean()), 1),
                       "tokens_equal_pct": round(100 * float(same.float().mean()), 1)}
    res["greedy_agreement"] = agree
    print(f"agreement {json.dumps(agree)} ({time.time() - t0:.0f} s)", flush=True)


def summary(res: dict) -> None:
    s = res.get("speed_ms", {})
    rows = [("prefill 8 x 2,048", "prefill 8x2048 bf16", "prefill 8x2048 fp8_weights", 1.3),
            ("decode b256 ctx 2,048, fp8 weights", "decode b256 ctx2048 bf16", "decode b256 ctx2048 fp8_weights", 1.2),
            ("decode b256 ctx 2,048, fp8 weights + cache", "decode b256 ctx2048 bf16", "decode b256 ctx2048 fp8_both",
             1.2),
            ("decode b64 ctx 8,192, fp8 cache", "decode b64 ctx8192 bf16", "decode b64 ctx8192 fp8_cache", 1.5),
            ("decode b64 ctx 8,192, fp8 weights + cache", "decode b64 ctx8192 bf16", "decode b64 ctx8192 fp8_both",
             1.5)]
    print(f"{'case':44s} {'bf16 ms':>9s} {'fp8 ms':>9s} {'speedup':>8s} {'target':>7s}  result")
    for label, a, b, target in rows:
        if a in s and b in s:
            x = s[a] / s[b]
            verdict = "met" if x >= target else f"missed by {100 * (target - x) / target:.0f}%"
            print(f"{label:44s} {s[a]:9.3f} {s[b]:9.3f} {x:7.2f}x {target:6.1f}x  {verdict}")
    if "perplexity" in res:
        print("perplexity:", {k: v for k, v in res["perplexity"].items() if k not in ("text", "tokens")})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("steps", nargs="+", choices=["pack", "table", "kernel", "model"])
    ap.add_argument("--out", type=Path, default=Path("fp8_h200.json"))
    ap.add_argument("--payload", type=Path, help="model: the folder holding meta.json and weights_a/b.pt "
                    "[default: SmolLM2's shape with random weights: speed only, --skip quality]")
    ap.add_argument("--mode", default="none", help="model: the decode step's compile mode (decode_step.COMPILE_MODES)")
    ap.add_argument("--skip", default="", help="model: parts left out, a comma list of quality, prefill, decode")
    ap.add_argument("--shape", default="smollm2", choices=sorted(SHAPES),
                    help="model without --payload: the random weights' shape (llama8b-16: Llama-3-8B's layers, 16)")
    args = ap.parse_args()
    if args.steps == ["pack"]:
        return pack(args.out)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "mode": args.mode}
    for step in args.steps:
        t = time.time()
        try:
            {"table": table, "kernel": kernel}[step](res) if step != "model" else model(
                res, args.payload, args.mode, set(args.skip.split(",")), args.shape)
        except Exception as exc:  # one step failing still returns the others
            res[f"{step}_error"] = f"{type(exc).__name__}: {exc}"
            import traceback

            traceback.print_exc()
        res[f"{step}_seconds"] = round(time.time() - t, 1)
        args.out.write_text(json.dumps(res, indent=1))
    summary(res)


if __name__ == "__main__":
    sys.exit(main())
