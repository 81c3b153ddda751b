"""Long text streams through a decoder bundle: perplexity past the model's positions, and flat memory.

    python benchmarks/generation_streams.py prepare [--out build/gen] [--budget]
    python benchmarks/generation_streams.py perplexity [--tokens 20000] [--chunk 128] [--configs NAME,...]
    python benchmarks/generation_streams.py memory [--tokens 100000] [--chunk 256] [--window 512]
    python benchmarks/generation_streams.py table benchmarks/results/generation_streams_*.json

`prepare` exports SmolLM2-135M twice (4 sinks and 0 sinks: the sinks count is an attribute of the cached
op) and builds a cpu bundle from each, into build/gen/. The text is the standard library's
`pydoc_data.topics.topics`, pages concatenated in sorted key order (about 100k SmolLM2 tokens).

`perplexity` feeds the stream by teacher forcing: chunks of `--chunk` tokens through `DecoderModel.step`, the
log-probability of each next token from the logits, aggregated per 1,000-token stretch. Configurations:

    full-8k        4-sink bundle, a cache larger than 8,000 tokens, the first 8,000 tokens only: exact full
                   attention inside the model's trained positions (the baseline of issue 17's criterion)
    full-stream    4-sink bundle, a cache larger than the stream: full attention with positions past 8,192
    window-1024    0-sink bundle, ring of 1,024: a plain sliding window
    sinks4-wW      4-sink bundle, ring of W (256, 512, 1024): StreamingLLM's sinks + window
    budget-N       4-sink bundle exported with pages of 16 rows (`prepare --budget`), a ring of 4,096: the
                   attention budget of N rows (260, 516, 1028: sinks 4 + W + k pages, AttentionBudget.from_total),
                   the same rows read as sinks4-w(N - 4)
    page16-wW      that bundle and ring with pages 0: the window alone (the same numbers as sinks4-wW)

`memory` runs a long stream through a ring of `--window` rows and samples the cache's bytes and the
process's resident memory every `--every` tokens.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GEN_DIR = ROOT / "build" / "gen"
RESULTS = ROOT / "benchmarks" / "results"
STRETCH = 1000  # tokens per perplexity row
TRAINED_POSITIONS = 8192  # SmolLM2-135M's max_position_embeddings
BUNDLES = {4: "smollm2_s4.edgeattn", 0: "smollm2_s0.edgeattn", "page": "smollm2_page16.edgeattn"}
PAGE, BUDGET_RING = 16, 4096  # the budget runs: rows a page, and the ring the pages are chosen from


# --------------------------------------------------------------------------------------------- the text

def stream_text() -> str:
    """pydoc's topic pages, in sorted key order, separated by blank lines (~0.47 M characters)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key].strip() for key in sorted(topics))


# ------------------------------------------------------------------------------------------------- prepare

def prepare(out: Path, *, window_max: int = 2048) -> dict[int, Path]:
    """Export SmolLM2 with 4 sinks and with none, and build a cpu bundle from each (skipped when present)."""
    from edgeattn.bundle.build import BuildConfig, build
    from edgeattn.decoder.export import DecoderExportConfig, export_decoder

    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for sinks, name in BUNDLES.items():
        bundle = out / name
        if not (bundle / "manifest.json").is_file():
            onnx_path = out / f"smollm2_s{sinks}.onnx"
            t0 = time.perf_counter()
            export_decoder("smollm2", onnx_path, DecoderExportConfig(sinks=sinks, window_max=window_max))
            print(f"exported {onnx_path.name} in {time.perf_counter() - t0:.0f} s", flush=True)
            t0 = time.perf_counter()
            build(onnx_path, BuildConfig(target="cpu", out=bundle, seq=(1, 1, 256),
                                         dims=(("cache", (8, 68, 68)),)), progress=print)
            print(f"built {bundle.name} in {time.perf_counter() - t0:.0f} s", flush=True)
            onnx_path.unlink()  # the bundle holds its own copy
        paths[sinks] = bundle
    return paths


def prepare_budget(out: Path, *, window_max: int = 2048) -> Path:
    """The 4-sink fp32 bundle exported with key bounds and retrieval pages of PAGE rows (skipped when present)."""
    from edgeattn.bundle.build import BuildConfig, build
    from edgeattn.decoder.export import DecoderExportConfig, export_decoder

    bundle = out / BUNDLES["page"]
    if not (bundle / "manifest.json").is_file():
        onnx_path = out / f"smollm2_dec_page{PAGE}.onnx"  # generation_cpu.py prepare --budget's, when there
        if not onnx_path.is_file():
            export_decoder("smollm2", onnx_path, DecoderExportConfig(sinks=4, window_max=window_max, page=PAGE))
        build(onnx_path, BuildConfig(target="cpu", out=bundle, seq=(1, 1, 256), dims=(("cache", (8, 68, 68)),)),
              progress=print)
    return bundle



# ---------------------------------------------------------------------------------------------- perplexity

@dataclass(frozen=True)
class StreamConfig:
    name: str
    sinks: int  # which bundle: the sinks count is an attribute of the exported op
    window_max: int  # ring rows (the live window is the whole ring)
    tokens: int | None = None  # read only this many tokens of the stream (None: all of it)
    budget: int = 0  # the page bundle: rows read (sinks + W + k pages), or with `window` the window alone
    window: int = 0

    @property
    def bundle(self):
        return "page" if self.budget or self.window else self.sinks


def configurations(tokens: int) -> dict[str, StreamConfig]:
    full = [StreamConfig("full-8k", 4, 8000, min(tokens, 8000)),  # 4 + 8000 rows hold 8,000 tokens: nothing evicted
            StreamConfig("full-stream", 4, tokens)]  # a cache as large as the stream
    windows = [StreamConfig("window-1024", 0, 1024)] + [StreamConfig(f"sinks4-w{w}", 4, w) for w in (256, 512, 1024)]
    budgets = [StreamConfig(f"budget-{w + 4}", 4, BUDGET_RING, budget=w + 4) for w in (256, 512, 1024)]
    pages0 = [StreamConfig(f"page16-w{w}", 4, BUDGET_RING, window=w) for w in (256, 512, 1024)]
    return {c.name: c for c in full + windows + budgets + pages0}


def open_model(bundle: Path, window_max: int, threads: int):
    from edgeattn.bundle.folder import open_bundle
    from edgeattn.runtime.generation.decoder_bundle import DecoderModel

    return DecoderModel(open_bundle(bundle), window_max=window_max, threads=threads).activate()


def token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """logits [S, V] (float32), targets [S] -> -log p(target) per row, in float64."""
    x = logits.astype(np.float64)
    m = x.max(axis=1)
    lse = m + np.log(np.exp(x - m[:, None]).sum(axis=1))
    return lse - x[np.arange(len(targets)), targets]


def stream_nll(model, ids: np.ndarray, chunk: int, *, progress=None, window: int = 0, pages: int = 0) -> np.ndarray:
    """Teacher forcing through DecoderModel.step: [len(ids) - 1] negative log-likelihoods of ids[1:] (window 0:
    the whole ring; `pages`: the attention budget's retrieval pages beyond the window)."""
    cache = model.new_cache(1)
    nll = np.empty(len(ids) - 1)
    for start in range(0, len(ids) - 1, chunk):
        piece = ids[start:start + chunk]
        logits = model.step(cache, [0], piece[None], window, pages=pages)[0]  # [S, V]
        targets = ids[start + 1:start + 1 + len(piece)]
        nll[start:start + len(targets)] = token_nll(logits[:len(targets)], targets)
        if progress:
            progress(start + len(piece))
    return nll


def stretches(nll: np.ndarray, size: int = STRETCH) -> list[dict]:
    """Rows per `size` target positions: nll[j] is the loss of the token at position j + 1."""
    rows = []
    positions = np.arange(1, len(nll) + 1)
    for start in range(0, int(positions[-1]) + 1, size):
        sel = (positions >= start) & (positions < start + size)
        if sel.any():
            rows.append({"start": start, "end": start + size, "tokens": int(sel.sum()),
                         "nll_sum": float(nll[sel].sum()), "ppl": float(math.exp(nll[sel].mean()))})
    return rows


def summarise(nll: np.ndarray) -> dict:
    positions = np.arange(1, len(nll) + 1)

    def ppl(sel):
        return float(math.exp(nll[sel].mean())) if sel.any() else None

    return {"whole": ppl(positions > 0), "first_8000": ppl(positions < 8000),
            "before_8192": ppl(positions < TRAINED_POSITIONS), "after_8192": ppl(positions >= TRAINED_POSITIONS)}


def run_perplexity(config: StreamConfig, ids: np.ndarray, *, chunk: int, threads: int, bundles: Path) -> dict:
    ids = ids[:config.tokens] if config.tokens else ids
    window_max = max(config.window_max, len(ids)) if config.name == "full-stream" else config.window_max
    model = open_model(bundles / BUNDLES[config.bundle], window_max, threads)
    window, pages, split = config.window, 0, None
    if config.budget:
        from edgeattn.attention.budget import AttentionBudget

        split = AttentionBudget.from_total(model.layout, config.budget, page=PAGE)
        window, pages = split.window, split.pages
        print(f"  {config.name}: sinks {split.sinks} + window {window} + {pages} pages of {PAGE} = {split.rows} rows "
              f"of a ring of {window_max}", flush=True)
    t0 = time.perf_counter()

    def progress(done):
        if done % 2000 < chunk:
            print(f"  {config.name}: {done} tokens, {time.perf_counter() - t0:.0f} s", flush=True)

    try:
        nll = stream_nll(model, ids, min(chunk, window_max), progress=progress, window=window, pages=pages)
    finally:
        model.deactivate()
    seconds = time.perf_counter() - t0
    return {"config": config.name, "sinks": config.sinks, "window_max": window_max, "chunk": min(chunk, window_max),
            "window": window, "pages": pages, "rows_read": split.rows if split else None,
            "tokens": int(len(ids)), "seconds": round(seconds, 1), "tokens_per_s": round(len(ids) / seconds, 1),
            "summary": summarise(nll), "stretches": stretches(nll)}


# ------------------------------------------------------------------------------------------------- memory

def vm_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS: resident now, VmHWM: the peak); ru_maxrss where no /proc."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def run_memory(bundle: Path, ids: np.ndarray, *, tokens: int, chunk: int, window: int, every: int,
               threads: int) -> dict:
    """Feed `tokens` tokens (the text repeated as needed) through a ring of `window` rows in chunks; sample
    the cache's bytes, the resident memory and the Python heap (numpy arrays included) every `every` tokens."""
    import tracemalloc

    model = open_model(bundle, window, threads)
    stream = np.resize(ids, tokens)  # the text, repeated
    cache = model.new_cache(1)
    tracemalloc.start()
    samples, t0 = [], time.perf_counter()

    def sample():
        samples.append({"tokens": int(cache.positions[0]), "cache_bytes": int(cache.nbytes),
                        "held_tokens": cache.held(0), "rss_kib": vm_kib("VmRSS"), "peak_rss_kib": vm_kib("VmHWM"),
                        "python_heap_bytes": tracemalloc.get_traced_memory()[0],
                        "seconds": round(time.perf_counter() - t0, 1)})

    sample()
    try:
        for start in range(0, tokens, chunk):
            model.step(cache, [0], stream[start:start + chunk][None], 0, last_only=True)  # as generation prefills
            if (start + chunk) // every > start // every or start + chunk >= tokens:
                sample()
                print(f"  {samples[-1]}", flush=True)
    finally:
        tracemalloc.stop()
        model.deactivate()
    return {"bundle": bundle.name, "tokens": tokens, "chunk": chunk, "window_max": window,
            "sinks": model.layout.sinks, "samples": samples}


def memory_table(result: dict) -> str:
    lines = ["| tokens | KV cache bytes | tokens held | RSS MiB | peak RSS MiB | Python heap KiB |",
             "|---|---|---|---|---|---|"]
    for s in result["samples"]:
        lines.append(f"| {s['tokens']:,} | {s['cache_bytes']:,} | {s['held_tokens']:,} | {s['rss_kib'] / 1024:.1f} | "
                     f"{s['peak_rss_kib'] / 1024:.1f} | {s['python_heap_bytes'] / 1024:.0f} |")
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------------- tables

ORDER = ("full-8k", "full-stream", "window-1024", "sinks4-w256", "sinks4-w512", "sinks4-w1024", "page16-w256",
         "budget-260", "page16-w512", "budget-516", "page16-w1024", "budget-1028")


def perplexity_table(results: list[dict]) -> str:
    results = sorted(results, key=lambda r: ORDER.index(r["config"]) if r["config"] in ORDER else len(ORDER))
    head = "| tokens | " + " | ".join(r["config"] for r in results) + " |"
    lines = [head, "|---" * (len(results) + 1) + "|"]
    starts = sorted({row["start"] for r in results for row in r["stretches"]})
    for start in starts:
        cells = []
        for r in results:
            row = next((x for x in r["stretches"] if x["start"] == start), None)
            cells.append(f"{row['ppl']:.2f}" if row else "")
        lines.append(f"| {start:,}-{start + STRETCH:,} | " + " | ".join(cells) + " |")
    for key, label in (("whole", "whole stream"), ("first_8000", "first 8,000"), ("after_8192", "after 8,192")):
        cells = [f"{r['summary'][key]:.2f}" if r["summary"].get(key) else "" for r in results]
        lines.append(f"| **{label}** | " + " | ".join(cells) + " |")
    lines.append("| tokens/s | " + " | ".join(f"{r['tokens_per_s']:.0f}" for r in results) + " |")
    return "\n".join(lines)


def environment(threads: int) -> dict:
    import onnxruntime

    return {"machine": platform.machine(), "cpus": os.cpu_count(), "threads": threads,
            "onnxruntime": onnxruntime.__version__, "python": platform.python_version(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def stream_ids(bundle: Path) -> np.ndarray:
    from edgeattn.bundle.folder import open_bundle
    from edgeattn.runtime.generation.decoder_bundle import DecoderModel

    return np.asarray(DecoderModel(open_bundle(bundle)).codec.encode(stream_text()), dtype=np.int64)


def write_json(name: str, payload: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"generation_streams_{name}.json"
    path.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="export and build the 4-sink and 0-sink SmolLM2 bundles")
    p.add_argument("--out", type=Path, default=GEN_DIR)
    p.add_argument("--budget", action="store_true", help="also the 4-sink bundle with pages (the budget-N runs)")
    p = sub.add_parser("perplexity", help="perplexity per 1,000-token stretch for each configuration")
    p.add_argument("--bundles", type=Path, default=GEN_DIR)
    p.add_argument("--tokens", type=int, default=20000)
    p.add_argument("--chunk", type=int, default=128)
    p.add_argument("--configs", default=",".join(ORDER), help=f"comma-separated, from {', '.join(ORDER)}")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--results", type=Path, default=RESULTS)
    p = sub.add_parser("memory", help="KV cache bytes and RSS over a long stream through a ring")
    p.add_argument("--bundle", type=Path, default=GEN_DIR / BUNDLES[4])
    p.add_argument("--tokens", type=int, default=100000)
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--window", type=int, default=512, help="ring rows (window_max)")
    p.add_argument("--every", type=int, default=10000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--results", type=Path, default=None, help="folder for the JSON (default: print only)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line at the end")
    p = sub.add_parser("table", help="markdown tables from result files")
    p.add_argument("files", type=Path, nargs="+")
    args = ap.parse_args(argv)
    if args.command == "prepare":
        for sinks, path in prepare(args.out).items():
            print(f"sinks {sinks}: {path}")
        if args.budget:
            print(f"pages of {PAGE}: {prepare_budget(args.out)}")
    elif args.command == "perplexity":
        names = args.configs.split(",")
        text_bundle = next((args.bundles / BUNDLES[k] for k in (4, "page") if (args.bundles / BUNDLES[k]).is_dir()),
                           args.bundles / BUNDLES[4])  # any bundle: the tokenizer is the same
        ids = stream_ids(text_bundle)
        if len(ids) < args.tokens:
            sys.exit(f"the text has {len(ids)} tokens, fewer than --tokens {args.tokens}")
        ids = ids[:args.tokens]
        table = configurations(args.tokens)
        for name in names:
            if name not in table:
                sys.exit(f"--configs: expected names from {', '.join(table)}, found {name!r}")
            result = run_perplexity(table[name], ids, chunk=args.chunk, threads=args.threads, bundles=args.bundles)
            result["environment"] = environment(args.threads)
            path = write_json(f"perplexity_{name}", result, args.results)
            print(f"{name}: {result['summary']} in {result['seconds']} s -> {path}", flush=True)
    elif args.command == "memory":
        ids = stream_ids(args.bundle)
        result = run_memory(args.bundle, ids, tokens=args.tokens, chunk=args.chunk, window=args.window,
                            every=args.every, threads=args.threads)
        result["environment"] = environment(args.threads)
        print(memory_table(result))
        if args.results:
            print(f"-> {write_json('memory_' + args.bundle.name.split('.')[0], result, args.results)}")
        if args.json:
            print(json.dumps(result))
    else:
        loaded = [json.loads(f.read_text(encoding="utf-8")) for f in args.files]
        ppl = [r for r in loaded if "stretches" in r]
        if ppl:
            print(perplexity_table(ppl))
        for r in loaded:
            if "samples" in r:
                print(memory_table(r))


if __name__ == "__main__":
    main()
