"""QAT benchmark: fidelity of QAT vs post-training quantization (same config) vs fp32, and ORT CPU speed.

    python benchmarks/qat_bench.py minilm-w8a8 minilm-w4 smollm2-w8a8 smollm2-w4 speed   # run cases
    python benchmarks/qat_bench.py table                                                 # print the table

Each case writes benchmarks/results/qat_<case>.json; `table` prints every result found.
Training text: gensim lee_background (MiniLM: all 300 documents, as sentences; SmolLM2: the first 80%).
Held-out: pang_lee_polarity sentences (MiniLM), the last 20% of lee_background (SmolLM2).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
WORK = Path(os.environ.get("EDGEATTN_BENCH_DIR", "/tmp/edgeattn-qat-bench"))

# Sized for a loaded 2-core CPU: few steps, short sequences (the settings are printed with each result).
CASES = {  # model, config name, block size, QAT steps, global batch, training seq len, eval seq len
    "minilm-w8a8": ("minilm", "w8a8", None, 60, 8, 32, 128),
    "minilm-w4": ("minilm", "w4", 32, 60, 8, 32, 128),
    "smollm2-w8a8": ("smollm2", "w8a8", None, 30, 4, 64, 256),
    "smollm2-w4": ("smollm2", "w4", 32, 30, 4, 64, 256),
}
LR, SCALE_LR = 2e-5, 5e-3


def run_case(name: str, steps: int | None, opts: argparse.Namespace | None = None) -> dict:
    """One case. `opts` (from the command line) may override the model folder, device, batch, sequence
    length, learning rates and schedule, and add SmoothQuant-style scaling (--smooth)."""
    import torch

    from edgeattn import hf_models
    from edgeattn.quantize import DistillConfig, calibrate, config_from_name, distill, export_qdq, quantize_
    from edgeattn import text
    from edgeattn.quantize.evaluate import fidelity
    from edgeattn.quantize.fidelity import onnx_forward, torch_forward

    model_name, cfg_name, block, default_steps, batch, seq, eval_seq = CASES[name]
    steps = default_steps if steps is None else steps
    o = opts or argparse.Namespace()
    batch, seq = getattr(o, "batch", None) or batch, getattr(o, "seq_len", None) or seq
    lr, scale_lr = getattr(o, "lr", None) or LR, getattr(o, "scale_lr", None) or SCALE_LR
    device = getattr(o, "device", None) or "cpu"
    schedule = getattr(o, "schedule", None) or "constant"
    alpha = getattr(o, "smooth", None)
    torch.manual_seed(0)
    model, tok, kind = hf_models.load(getattr(o, "model_dir", None) or model_name)
    config = config_from_name(cfg_name, block_size=block)
    teacher = copy.deepcopy(model)
    docs = text.lee_documents()  # decoders: the last 20% held out (the split the documented results used)
    train = docs[:int(len(docs) * 0.8)] if kind == "decoder" else docs
    examples = text.padded_examples(tok, train, kind, seq)
    held = docs[int(len(docs) * 0.8):] if kind == "decoder" else text.polarity_sentences()
    if device == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 matmuls
    ref = _on(torch_forward(teacher.to(device), kind), device)
    model.to(device)
    calib = [{k: v[i:i + batch].to(device) for k, v in examples.items()} for i in range(0, 8 * batch, batch)]
    t0 = time.time()
    smoothing = None
    if alpha is not None:
        from edgeattn.quantize.smoothing import SmoothConfig, smooth_

        smoothing = smooth_(model, calib, SmoothConfig(alpha=alpha)).as_dict()
        print(name, f"smoothing alpha {alpha}: {len(smoothing['smoothed'])} layers, max scale {smoothing['max_scale']}",
              flush=True)
    report = quantize_(model, config)
    model.to(device)
    calibrate(model, calib)
    ptq = fidelity(kind, ref, _on(torch_forward(model, kind), device), tok, held, eval_seq)
    print(name, "PTQ", ptq, flush=True)
    losses = distill(model, teacher, text.sampled_batches(examples, batch), kind,
                     DistillConfig(steps=steps, lr=lr, scale_lr=scale_lr, device=device, lr_schedule=schedule)).losses
    train_s = time.time() - t0
    qat = fidelity(kind, ref, _on(torch_forward(model, kind), device), tok, held, eval_seq)
    print(name, "QAT (torch)", qat, f"{train_s:.0f} s", flush=True)
    out = WORK / f"{name}.qdq.onnx"
    model.cpu()
    summary = export_qdq(model, kind, out)
    try:
        onnx_fid = fidelity(kind, ref, onnx_forward(out), tok, held, eval_seq)
    except Exception as e:  # e.g. an older ONNX Runtime that rejects the file's IR version
        onnx_fid = {"error": f"{type(e).__name__}: {e}"[:300]}
    print(name, "QAT (ONNX Runtime)", onnx_fid, flush=True)
    result = {"case": name, "model": model_name, "config": cfg_name, "block_size": block, "steps": steps,
              "batch": batch, "seq_len": seq, "lr": lr, "scale_lr": scale_lr, "schedule": schedule, "device": device,
              "smoothing_alpha": alpha, "smoothing": smoothing,
              "train_s": round(train_s, 1), "layers": len(report.quantized),
              "float_layers": len(report.float_layers), "loss_first": losses[0] if losses else None,
              "loss_last": losses[-1] if losses else None, "ptq": ptq, "qat_torch": qat, "qat_onnx": onnx_fid,
              "onnx": str(out), "onnx_summary": summary}
    _save(name + (getattr(o, "tag", "") or ""), result)
    return result


def run_speed(repeats: int = 12, rounds: int = 7) -> dict:
    """The INT8 MiniLM bundle (edgeattn build --target cpu) vs ORT quantize_dynamic, at batch 1 and 8."""
    import numpy as np
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from edgeattn.bundle.build import BuildConfig, build
    from edgeattn.export import export_hf

    qdq = WORK / "minilm-w8a8.qdq.onnx"
    if not qdq.is_file():
        raise SystemExit(f"{qdq} missing: run the minilm-w8a8 case first")
    fp32 = export_hf("minilm", WORK / "minilm.fp32.onnx")
    dyn = WORK / "minilm.dynamic.onnx"
    quantize_dynamic(str(fp32), str(dyn), weight_type=QuantType.QInt8, per_channel=True)
    bundle = build(qdq, BuildConfig(target="cpu", out=WORK / "minilm-w8a8.edgeattn", parity_tolerance=0.5,
                                    batch=(1, 1, 8), seq=(1, 128, 128)))
    models = {"fp32": fp32, "ort quantize_dynamic": dyn, "edgeattn qdq (raw)": qdq,
              "edgeattn bundle (cpu)": bundle.path / bundle.manifest.artifact}
    rng = np.random.default_rng(0)
    sessions, feeds = {}, {}
    for label, path in models.items():
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        sessions[label] = sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        for b in (1, 8):
            f = {"input_ids": rng.integers(1000, 20000, (b, 128)).astype(np.int64),
                 "attention_mask": np.ones((b, 128), np.int64)}
            for i in sess.get_inputs():  # a fused bundle adds the run-time window: 0 = full attention
                if i.name not in f:
                    f[i.name] = np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.int64)
            feeds[label, b] = f
            for _ in range(3):
                sess.run(None, f)
    # interleaved rounds: a shared, noisy machine slows every model alike within a round
    per_round: dict[str, list[float]] = {}
    for _ in range(rounds):
        for b in (1, 8):
            for label, sess in sessions.items():
                ts = []
                for _ in range(repeats if b == 1 else max(3, repeats // 4)):
                    t = time.perf_counter()
                    sess.run(None, feeds[label, b])
                    ts.append((time.perf_counter() - t) * 1e3)
                per_round.setdefault(f"{label} b{b}", []).append(float(np.median(ts)))
    timings = {k: float(np.median(v)) for k, v in per_round.items()}
    for k, v in timings.items():
        print(f"{k}: {v:.1f} ms (median of {rounds} rounds: {', '.join(f'{x:.1f}' for x in per_round[k])})", flush=True)
    result = {"case": "speed", "seq_len": 128, "median_ms": timings, "rounds": per_round,
              "bundle_ops": bundle.manifest.sections["engine"].get("op_counts", {}),
              "passes": [p["summary"] for p in bundle.manifest.sections["passes"]]}
    _save("speed", result)
    return result


def _on(forward, device: str):
    """A forward that takes CPU batches, runs on `device` and returns CPU outputs."""
    if device == "cpu":
        return forward
    return lambda batch: forward({k: v.to(device) for k, v in batch.items()}).float().cpu()


def _save(name: str, result: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"qat_{name}.json").write_text(json.dumps(result, indent=2, default=str))


def table() -> None:
    print("| case | steps | PTQ (same config) | QAT torch | QAT ONNX Runtime | target |")
    print("|---|---|---|---|---|---|")
    targets = {"minilm-w8a8": "cos mean >= 0.995, min >= 0.98", "minilm-w4": "cos mean >= 0.98",
               "smollm2-w8a8": "ppl <= +3%", "smollm2-w4": "ppl <= +10%"}
    for name in CASES:
        files = sorted(RESULTS.glob(f"qat_{name}*.json"))  # qat_<case>.json and tagged runs (qat_<case>_h200.json)
        if not files:
            print(f"| {name} | not run | | | | {targets[name]} |")
            continue
        for f in files:
            r = json.loads(f.read_text())
            fmt = _fmt_ppl if r["model"] == "smollm2" else _fmt_cos
            run = f"{name}{f.stem[len('qat_') + len(name):]}" + (f" ({r.get('device', 'cpu')}"
                                                                 + (f", smooth {r['smoothing_alpha']}" if r.get("smoothing_alpha") else "") + ")")
            print(f"| {run} | {r['steps']} | {fmt(r['ptq'])} | {fmt(r['qat_torch'])} | {fmt(r['qat_onnx'])} | {targets[name]} |")
    f = RESULTS / "qat_speed.json"
    if f.is_file():
        r = json.loads(f.read_text())
        print("\n| ORT CPU, MiniLM, seq 128, 2 threads | b1 ms | b8 ms |\n|---|---|---|")
        for label in dict.fromkeys(k.rsplit(" ", 1)[0] for k in r["median_ms"]):
            print(f"| {label} | {r['median_ms'][label + ' b1']:.1f} | {r['median_ms'][label + ' b8']:.1f} |")


def _fmt_cos(d: dict) -> str:
    return f"cos mean {d['cos_mean']:.4f} min {d['cos_min']:.4f}"


def _fmt_ppl(d: dict) -> str:
    return f"ppl {d['ppl']:.2f} vs {d['ppl_float']:.2f} ({d['ppl_increase_pct']:+.1f}%)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", default=[*CASES, "speed", "table"])
    parser.add_argument("--steps", type=int, default=None, help="override the QAT steps of every case")
    parser.add_argument("--model-dir", default=None, help="a Hugging Face folder instead of the packaged model")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--scale-lr", type=float, default=None)
    parser.add_argument("--schedule", default="constant", choices=["constant", "cosine"])
    parser.add_argument("--smooth", type=float, default=None, help="SmoothQuant alpha before quantizing (W8A8)")
    parser.add_argument("--tag", default="", help="suffix of the result file name (qat_<case><tag>.json)")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    for case in args.cases:
        if case == "table":
            table()
        elif case == "speed":
            run_speed()
        elif case in CASES:
            run_case(case, args.steps, args)
        else:
            raise SystemExit(f"unknown case {case!r}: expected one of {', '.join([*CASES, 'speed', 'table'])}")


if __name__ == "__main__":
    main()
