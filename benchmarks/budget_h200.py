"""The attention budget on the H200: the decode step reading sinks + W + k pages against the window of the same
row count, SmolLM2-135M's shape (random weights), bf16, context 8,192 (a full ring).

    python benchmarks/budget_h200.py [--out results.json] [--smoke]

Prints, side by side, per batch (64 and 1): the GPU time of the attention alone (graph replays of the op: the
window's split-K kernel over W = 1,024 rows, against the budget's selection + block-sparse attention + row and
bounds write over W = 256 and 48 pages of 16, the first path (v1, EDGEATTN_BUDGET_V1=1) and v2 at several split
counts and scoring blocks, v2 with the bounds as the engine keeps them (min, max and their sum: the scoring reads
the sum) and with min and max only), and the whole decode step (30 layers, the linked compile mode, greedy on the device)
as graph replay time and as tokens/s seen by the host: window, budget v1, budget v2 (its default splits and one
other; bounds of 3 vectors a page, and of 2). First a correctness check of the CUDA op against the reference op and of the captured budget step against
the eager one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from edgeattn.plugins.kernels.budget_bounds import with_sums
from edgeattn.plugins.kernels.cached_decode import cached_decode, cached_decode_splits
from edgeattn.runtime.cuda.budget import BudgetGraph, budget_logits, refresh_pages
from edgeattn.runtime.cuda.decode_step import DecodeGraph, DecoderShape, PackedDecoder

SINKS, CONTEXT, PAGE = 4, 8192, 16
WINDOW = 1024  # the window alone: 1,028 rows a query
BUDGET_W, BUDGET_K = 256, 48  # the budget: 4 + 256 + 48 * 16 = 1,028 rows a query


def smollm2_weights(layers=30, window_max=CONTEXT, device="cuda", dtype=torch.bfloat16, seed=0) -> PackedDecoder:
    """SmolLM2-135M's shape with random weights (hidden 576, 9 heads, 3 KV heads, head_dim 64, tied embeddings)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    hidden, heads, kv, d, inter, vocab = 576, 9, 3, 64, 1536, 49152
    shape = DecoderShape(layers=layers, hidden=hidden, heads=heads, kv_heads=kv, head_dim=d, intermediate=inter,
                         vocab=vocab, eps=1e-5, sinks=SINKS, window_max=window_max, scale=d ** -0.5)
    rnd = lambda *s, std=0.02: (torch.randn(*s, generator=g) * std).to(device, dtype)  # noqa: E731
    embed = rnd(vocab, hidden, std=0.5)
    t = {"embed": embed, "norm": torch.ones(hidden, device=device, dtype=dtype), "lm_head": embed}
    t["ln1"] = [torch.ones(hidden, device=device, dtype=dtype) for _ in range(layers)]
    t["ln2"] = [torch.ones(hidden, device=device, dtype=dtype) for _ in range(layers)]
    t["wqkv"] = [rnd((heads + 2 * kv) * d, hidden, std=0.08) for _ in range(layers)]
    t["bqkv"] = [None] * layers
    t["wo"] = [rnd(hidden, heads * d) for _ in range(layers)]
    t["wgu"] = [rnd(2 * inter, hidden) for _ in range(layers)]
    t["wd"] = [rnd(hidden, inter) for _ in range(layers)]
    t["qn"] = [None] * layers
    t["kn"] = [None] * layers
    inv_freq = 1.0 / (100000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    return PackedDecoder(shape, t, inv_freq.to(device), 1.0)


def replay_ms(graph, n=100):
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


def host_ms(step, ids, pos, *args, n=100):
    step(ids, pos, *args).cpu()
    t0 = time.perf_counter()
    for _ in range(n):
        step(ids, pos, *args).cpu()
    return 1e3 * (time.perf_counter() - t0) / n


def correctness(smoke):
    """The CUDA op against the reference op (float32 on the CPU), and graph replays against eager steps."""
    import edgeattn.plugins.kernels.ring_ops  # noqa: F401
    from edgeattn.attention.cached_reference import page_bounds_np

    out = {}
    torch.manual_seed(7)
    b, h, h_kv, d, wmax = 4, 9, 3, 64, 512
    dev, dt = "cuda", torch.bfloat16
    kc = torch.randn(b, h_kv, SINKS + wmax, d, device=dev, dtype=dt)
    vc = torch.randn_like(kc)
    pos = torch.tensor([3, 100, 700, 2000], device=dev)
    bounds = torch.from_numpy(page_bounds_np(kc.float().cpu().numpy(), pos.cpu().numpy(), SINKS, PAGE)).to(dev, dt)
    worst = {}
    for pages in (0, 1, 5, 32):
        q, qs = torch.randn(b, h, d, device=dev, dtype=dt), torch.randn(b, h, d, device=dev, dtype=dt)
        k, v = torch.randn(b, h_kv, d, device=dev, dtype=dt), torch.randn(b, h_kv, d, device=dev, dtype=dt)
        ref = [t.cpu().float() for t in (kc, vc, bounds)]
        kc_prev, vc_prev, bounds_prev = kc.clone(), vc.clone(), bounds.clone()
        got = torch.ops.edgeattn.ring_decode_budget(q, qs, k, v, kc, vc, bounds, pos, torch.tensor(64, device=dev),
                                                    torch.tensor(pages, device=dev), SINKS, 0.0, 0, PAGE, 32)
        want = torch.ops.edgeattn.ring_decode_budget(*(t.cpu().float() for t in (q, qs, k, v)), *ref, pos.cpu(),
                                                     torch.tensor(64), torch.tensor(pages), SINKS, 0.0, 0, PAGE, 32)
        worst[pages] = {"out_max_abs_diff": float((got.float().cpu() - want).abs().max()),
                        "rows_equal": bool(torch.equal(kc.cpu().float(), ref[0])),
                        "bounds_equal": bool(torch.equal(bounds.cpu().float(), ref[2]))}
        # the same step on a copy of the cache with the sums kept (the engine's bounds): the same output and rows
        kc3, vc3, b3 = kc_prev.clone(), vc_prev.clone(), with_sums(bounds_prev)
        got3 = torch.ops.edgeattn.ring_decode_budget(q, qs, k, v, kc3, vc3, b3, pos, torch.tensor(64, device=dev),
                                                     torch.tensor(pages, device=dev), SINKS, 0.0, 0, PAGE, 32)
        worst[pages].update(sums_out_equal=bool(torch.equal(got3, got)), sums_rows_equal=bool(torch.equal(kc3, kc)),
                            sums_bounds_equal=bool(torch.allclose(b3, with_sums(bounds), rtol=0, atol=0,
                                                                  equal_nan=True)))  # empty pages: inf - inf
        pos = pos + 1
    out["op_vs_reference"] = worst
    print("op", json.dumps(worst), flush=True)
    w = smollm2_weights(layers=2, window_max=64)
    tokens = torch.randint(3, 40000, (3, 90), device="cuda")
    k1, v1 = w.new_cache(3)
    k2, v2 = w.new_cache(3)
    b1 = [torch.zeros(3, 3, 4, 2, 64, device="cuda", dtype=dt) for _ in range(2)]
    b2 = [torch.zeros(3, 3, 4, 3, 64, device="cuda", dtype=dt) for _ in range(2)]  # the engine's: with the sums
    graph = BudgetGraph(w, k2, v2, b2, batch=3, splits=1, k_max=2, page=16, compile="linked")
    same = 0
    with torch.no_grad():
        for p in range(90):  # stream 1 wraps the ring of 64
            p3 = torch.tensor([p, p + 5, max(p - 9, 0)], device="cuda")
            want = budget_logits(w, tokens[:, p], p3, torch.tensor(16, device="cuda"), torch.tensor(2, device="cuda"),
                                 k1, v1, b1, splits=1, k_max=2, page=16).argmax(-1)
            same += int(torch.equal(want, graph(tokens[:, p], p3, 16, 2)))
    kept = page_bounds_np(k2[1].float().cpu().numpy(), (torch.tensor([90, 95, 81])).numpy(), SINKS, 16)
    kept3 = with_sums(torch.from_numpy(kept).to(dt)).float().numpy()
    out["graph_vs_eager"] = {"steps_equal": same, "of": 90,  # the graph's bounds against its own rows, recomputed
                             "bounds_equal_recomputed": bool((b2[1].float().cpu().numpy() == kept3).all())}
    print("graph", json.dumps(out["graph_vs_eager"]), flush=True)
    return out


def attention_alone(batch, sms):
    """GPU time (graph replays) of one layer's attention: window 1,024 against the budget W 256 + 48 pages (the
    row and bounds write included), the first path (v1: EDGEATTN_BUDGET_V1) against v2 at several split counts and
    scoring blocks; and whether v2 chooses v1's pages and gives its output on this cache."""
    import triton.testing

    from edgeattn.plugins.kernels import budget_decode as bd
    from edgeattn.plugins.kernels.budget_decode import budget_decode, budget_splits, select_block, select_pages

    h, h_kv, d, dt = 9, 3, 64, torch.bfloat16
    c = SINKS + CONTEXT
    kc = torch.randn(batch, h_kv, c, d, device="cuda", dtype=dt)
    vc = torch.randn_like(kc)
    bounds = torch.zeros(batch, h_kv, CONTEXT // PAGE, 2, d, device="cuda", dtype=dt)
    pos = torch.full((batch,), CONTEXT, device="cuda")
    refresh_pages([kc], [bounds], pos - c, c, sinks=SINKS, page=PAGE)
    q, qs = torch.randn(batch, h, 1, d, device="cuda", dtype=dt), torch.randn(batch, h, 1, d, device="cuda", dtype=dt)
    k, v = torch.randn(batch, h_kv, d, device="cuda", dtype=dt), torch.randn(batch, h_kv, d, device="cuda", dtype=dt)
    win, bw, bk = (torch.tensor(x, device="cuda") for x in (WINDOW, BUDGET_W, BUDGET_K))
    s_win = cached_decode_splits(batch * h_kv, SINKS, WINDOW, sms)
    s_bud = budget_splits(batch * h_kv, SINKS, BUDGET_W, 64, PAGE, sms)
    s_v1 = cached_decode_splits(batch * h_kv, SINKS, BUDGET_W + 64 * PAGE, sms)  # the first path's rule
    bench = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")  # noqa: E731
    attn = dict(sinks=SINKS, page=PAGE, k_max=64)
    args = (q[:, :, 0], qs[:, :, 0], k, v, kc, vc, bounds, pos, bw, bk)

    def budget(legacy, splits=s_bud, block_p=None, write=True, pdl=None):
        return budget_decode(*args, **attn, splits=splits, write=write, legacy=legacy, block_p=block_p, pdl=pdl)

    # same pages, same output (before any write)
    sel1 = select_pages(q[:, :, 0], bounds, pos, bw, bk, sinks=SINKS, page=PAGE, k_max=64, legacy=True)
    sel2 = select_pages(q[:, :, 0], bounds, pos, bw, bk, sinks=SINKS, page=PAGE, k_max=64, legacy=False)
    same = bool(torch.equal(sel1.sort(1).values, sel2.sort(1).values))
    want = budget(True, s_v1, write=False).float()
    out_diff = float((want - budget(False, write=False).float()).abs().max())
    row = {"batch": batch, "context": CONTEXT, "v2_selects_v1_pages": same, "v2_vs_v1_out_max_abs_diff": out_diff,
           "window_ms": bench(lambda: cached_decode(q, qs, kc, vc, pos, win, sinks=SINKS, splits=s_win)),
           "window_splits": s_win,
           "window_ms_splits1": bench(lambda: cached_decode(q, qs, kc, vc, pos, win, sinks=SINKS, splits=1)),
           "budget_splits": s_bud, "v1_splits": s_v1,
           "v1_budget_ms": bench(lambda: budget(True, s_v1)),
           "v1_select_ms": bench(lambda: select_pages(q[:, :, 0], bounds, pos, bw, bk, **attn, legacy=True)),
           "v1_attend_no_write_ms": bench(lambda: budget(True, s_v1, write=False)),
           "v2_select_block_p_shipped": select_block(batch * h_kv, CONTEXT // PAGE, sms)}
    # the scoring programs: pages each and warps; the best is kept (bd.SELECT_BLOCKS, bd.SELECT_TUNING) for the run
    select_sweep = {}
    for bp in (16, 32, 64, 128, 256):
        for warps in (2, 4):
            bd.SELECT_TUNING.update(num_warps=warps)
            select_sweep[f"block_p{bp}-warps{warps}"] = (bench(lambda: select_pages(
                q[:, :, 0], bounds, pos, bw, bk, **attn, legacy=False, block_p=bp)), bp, warps)
    best = min(select_sweep, key=lambda name: select_sweep[name][0])
    row["v2_select_ms"] = {name: ms for name, (ms, _, _) in select_sweep.items()}
    row["v2_select_best"] = best
    bd.SELECT_BLOCKS, _ = (select_sweep[best][1],), bd.SELECT_TUNING.update(num_warps=select_sweep[best][2])
    # the bounds as the engine keeps them (3 vectors a page; the scoring reads the sum): same pages, time
    bounds3 = with_sums(bounds)
    args3 = (*args[:6], bounds3, *args[7:])
    sel3 = select_pages(q[:, :, 0], bounds3, pos, bw, bk, sinks=SINKS, page=PAGE, k_max=64, legacy=False)
    row["sums_select_same_pages"] = bool(torch.equal(sel2.sort(1).values, sel3.sort(1).values))
    row["sums_select_ms"] = bench(lambda: select_pages(q[:, :, 0], bounds3, pos, bw, bk, **attn, legacy=False))
    row["pairs_select_ms"] = bench(lambda: select_pages(q[:, :, 0], bounds, pos, bw, bk, **attn, legacy=False))
    # the v2 attention's tuning: keys a block, warps, stages (a share of each segment a split won an earlier sweep
    # at both batches); the best (at the default splits) is kept in bd.ATTEND_TUNING for the run
    shipped = dict(bd.ATTEND_TUNING)
    sweep = {}
    for block_n, warps, stages in ((128, 4, 2), (128, 4, 3), (128, 4, 4), (128, 8, 3), (64, 4, 2), (64, 2, 2)):
        bd.ATTEND_TUNING.update(BLOCK_N=block_n, num_warps=warps, num_stages=stages)
        name = f"block_n{block_n}-warps{warps}-stages{stages}"
        try:
            sweep[name] = (bench(lambda: budget(False)), dict(bd.ATTEND_TUNING))
        except Exception as e:  # a variant this Triton does not compile
            print("tuning", name, "failed:", repr(e)[:200], flush=True)
            sweep[name] = (float("inf"), dict(bd.ATTEND_TUNING))
    best = min(sweep, key=lambda name: sweep[name][0])
    row["v2_tuning_ms"] = {name: (ms if ms != float("inf") else None) for name, (ms, _) in sweep.items()}
    row["v2_tuning_shipped"], row["v2_tuning_best"] = shipped, sweep[best][1]
    bd.ATTEND_TUNING.update(sweep[best][1])
    sel_best = select_pages(q[:, :, 0], bounds, pos, bw, bk, sinks=SINKS, page=PAGE, k_max=64, legacy=False)
    row["v2_best_selects_v1_pages"] = bool(torch.equal(sel1.sort(1).values, sel_best.sort(1).values))
    row["v2_best_vs_v1_out_max_abs_diff"] = float((want - budget(False, write=False).float()).abs().max())
    for sp in ((1, 2, 4) if batch > 8 else (4, 8, 16)):
        row[f"v2_budget_ms_splits{sp}"] = bench(lambda: budget(False, splits=sp))
    row["v2_budget_ms"] = bench(lambda: budget(False))
    row["v2_attend_no_write_ms"] = bench(lambda: budget(False, write=False))
    out3 = budget_decode(*args3, **attn, splits=s_bud, write=False, legacy=False)
    row["sums_vs_pairs_out_max_abs_diff"] = float((out3.float() - budget(False, write=False).float()).abs().max())
    row["sums_budget_ms"] = bench(lambda: budget_decode(*args3, **attn, splits=s_bud, write=True, legacy=False))
    row["pairs_budget_ms"] = bench(lambda: budget(False))
    row["sums_over_window"] = row["sums_budget_ms"] / row["window_ms"]
    row["v1_over_window"] = row["v1_budget_ms"] / row["window_ms"]
    row["v2_over_window"] = row["v2_budget_ms"] / row["window_ms"]
    print("attention", json.dumps(row), flush=True)
    return row


def steps(w, batch, sms):
    """The whole step (linked pieces, greedy on the device): window 1,024 against the budget, same cache."""
    s = w.shape
    keys, values = w.new_cache(batch)
    for t in keys + values:
        t.normal_()
    bounds = [torch.zeros(batch, s.kv_heads, CONTEXT // PAGE, 2, s.head_dim, device="cuda", dtype=w.dtype)
              for _ in range(s.layers)]
    pos = torch.full((batch,), CONTEXT, dtype=torch.int64)
    refresh_pages(keys, bounds, pos.cuda() - s.capacity, s.capacity, sinks=s.sinks, page=PAGE)
    sums = [with_sums(b) for b in bounds]  # as the engine keeps them (runtime.cuda.budget.BOUND_SLOTS)
    ids = torch.full((batch,), 5, dtype=torch.int64)
    from edgeattn.plugins.kernels.budget_decode import budget_splits

    rows = []
    t0 = time.perf_counter()
    window = DecodeGraph(w, keys, values, batch=batch, compile="linked",
                         splits=cached_decode_splits(batch * s.kv_heads, s.sinks, WINDOW, sms))
    window(ids, pos, WINDOW)
    rows.append({"engine": "window", "splits": window.splits, "window": WINDOW, "pages": 0,
                 "capture_s": time.perf_counter() - t0,
                 "graph_replay_ms": replay_ms(window.graph), "host_ms_per_step": host_ms(window, ids, pos, WINDOW)})
    del window
    default = budget_splits(batch * s.kv_heads, s.sinks, BUDGET_W, 64, PAGE, sms)
    runs = [("budget_v1", "1", cached_decode_splits(batch * s.kv_heads, s.sinks, BUDGET_W + 64 * PAGE, sms), "0",
             bounds),
            ("budget_v2_pairs", "0", default, "1", bounds), ("budget_v2", "0", default, "1", sums)]
    if batch < 8:
        runs.append(("budget_v2", "0", default // 2, "1", sums))
    for engine, legacy, splits, pdl, kept in runs:
        os.environ["EDGEATTN_BUDGET_V1"] = legacy  # read by the op at the warm-up and the capture
        os.environ["EDGEATTN_PDL"] = pdl
        t0 = time.perf_counter()
        budget = BudgetGraph(w, keys, values, kept, batch=batch, k_max=64, page=PAGE, compile="linked",
                             splits=splits)
        budget(ids, pos, BUDGET_W, BUDGET_K)
        rows.append({"engine": engine, "splits": splits, "window": BUDGET_W, "pages": BUDGET_K,
                     "bound_vectors": kept[0].shape[3],
                     "capture_s": time.perf_counter() - t0, "graph_replay_ms": replay_ms(budget.graph),
                     "host_ms_per_step": host_ms(budget, ids, pos, BUDGET_W, BUDGET_K)})
        del budget
    os.environ["EDGEATTN_BUDGET_V1"] = "0"
    os.environ.pop("EDGEATTN_PDL")
    for r in rows:
        r.update(batch=batch, context=CONTEXT, rows_read=s.sinks + r["window"] + r["pages"] * PAGE,
                 tokens_per_s=batch / (r["host_ms_per_step"] / 1e3))
        if r["engine"] != "window":
            r["tokens_per_s_over_window"] = r["tokens_per_s"] / rows[0]["tokens_per_s"]
            r["replay_window_over_budget"] = rows[0]["graph_replay_ms"] / r["graph_replay_ms"]
        print("step", json.dumps(r), flush=True)
    del keys, values, bounds, sums
    torch.cuda.empty_cache()
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--smoke", action="store_true", help="2 layers: a quick run of every part")
    parser.add_argument("--parts", default="check,attention,steps")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "shape": "SmolLM2-135M, bf16",
              "context": CONTEXT, "window": WINDOW, "budget": {"window": BUDGET_W, "pages": BUDGET_K, "page": PAGE}}

    def save():
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)

    if "check" in parts:
        result["correctness"] = correctness(args.smoke)
        save()
    from edgeattn.plugins.kernels import budget_decode as bd

    shipped = (dict(bd.ATTEND_TUNING), dict(bd.SELECT_TUNING), bd.SELECT_BLOCKS)
    best = {}
    if "attention" in parts:
        result["attention"] = []
        for b in (64, 1):
            bd.ATTEND_TUNING.update(shipped[0])
            bd.SELECT_TUNING.update(shipped[1])
            bd.SELECT_BLOCKS = shipped[2]
            result["attention"].append(attention_alone(b, sms))
            best[b] = (dict(bd.ATTEND_TUNING), dict(bd.SELECT_TUNING), bd.SELECT_BLOCKS)
            save()
    if "steps" in parts:
        w = smollm2_weights(layers=2 if args.smoke else 30)
        result["steps"] = []
        for batch in (64, 1):
            attend, select, blocks = best.get(batch, shipped)  # the v2 kernels' best tuning at this batch
            bd.ATTEND_TUNING.update(attend)
            bd.SELECT_TUNING.update(select)
            bd.SELECT_BLOCKS = blocks
            result["steps"] += steps(w, batch, sms)
            result["steps"][-1]["v2_tuning"] = {"attend": attend, "select": select, "select_block_p": blocks}
            save()
    print("summary")
    for r in result.get("attention", []):
        v2_select = r["v2_select_ms"][r["v2_select_best"]]
        print(f"  attention b{r['batch']}: window {r['window_ms']:.4f} ms, budget v1 {r['v1_budget_ms']:.4f} ms "
              f"(select {r['v1_select_ms']:.4f}), v2 {r['v2_budget_ms']:.4f} ms (select "
              f"{v2_select:.4f}); same pages {r['v2_selects_v1_pages']}; v2 with the sums {r['sums_budget_ms']:.4f} "
              f"ms (select {r['sums_select_ms']:.4f}) against {r['pairs_budget_ms']:.4f} ({r['pairs_select_ms']:.4f}), "
              f"same pages {r['sums_select_same_pages']}")
    for r in result.get("steps", []):
        print(f"  step b{r['batch']} {r['engine']:15s} splits {r['splits']} W {r['window']:5d} k {r['pages']:3d}: "
              f"replay {r['graph_replay_ms']:.3f} ms, host {r['host_ms_per_step']:.3f} ms, {r['tokens_per_s']:.0f} "
              f"tok/s {r.get('tokens_per_s_over_window', '')}")


if __name__ == "__main__":
    main()
