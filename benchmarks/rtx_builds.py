"""Build real models for the rtx target (TensorRT for RTX, no GPU needed) and print what each build gave.

    python benchmarks/rtx_builds.py                          # MiniLM and SmolLM2, exported here, fp16
    python benchmarks/rtx_builds.py --only minilm
    python benchmarks/rtx_builds.py --onnx minilm-w8a8=/path/minilm_w8a8.onnx:fp16 \
                                    --onnx minilm-w4=/path/minilm_w4.onnx:fp16 --no-export

Per model: build wall time (export excluded), the engine builder's own time, engine size, the compute
layers by precision (from the detailed build log), layers left in fp32, where attention went, problems.
The W8A8 / W4 ONNX files come from `edgeattn quantize` (pass them with --onnx). Until then,
`--ort-quantized` makes stand-ins with ONNX Runtime's quantization tools from an opset-21 MiniLM export
(W8A8: static QDQ, symmetric, per-channel weights, per-tensor activations, calibrated on random token
ids; W4: block-wise int4 weight-only QDQ, block 32). They test the build, not the accuracy.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

EXPORTS = {"minilm": ("minilm", "fp16"), "smollm2": ("smollm2", "fp16")}


def export(alias: str, out: Path, attention: str) -> Path:
    from edgeattn.export import ExportConfig, export_hf

    if not out.exists():
        export_hf(alias, out, ExportConfig(attention=attention))
    return out


def ort_quantized(work: Path) -> list[tuple[str, Path, str]]:
    """Stand-in W8A8 and W4 MiniLM (Q/DQ ONNX, opset 21) made with onnxruntime.quantization."""
    import numpy as np
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    from edgeattn.export import ExportConfig, export_hf

    src = work / "minilm-opset21.onnx"
    if not src.exists():
        export_hf("minilm", src, ExportConfig(opset=21))
    w8a8, w4 = work / "minilm-w8a8-ort.onnx", work / "minilm-w4-ort.onnx"
    if not w8a8.exists():
        rng = np.random.default_rng(0)
        batches = [{"input_ids": rng.integers(0, 1000, (1, 32)).astype(np.int64),
                    "attention_mask": np.ones((1, 32), np.int64)} for _ in range(8)]

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.it = iter(batches)

            def get_next(self):
                return next(self.it, None)

        quantize_static(str(src), str(w8a8), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})
    if not w4.exists():
        config = DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=True, quant_format=QuantFormat.QDQ)
        quantizer = MatMulNBitsQuantizer(onnx.load(str(src)), algo_config=config)
        quantizer.process()
        quantizer.model.save_model_to_file(str(w4), False)
    return [("minilm-w8a8-ort", w8a8, "fp16"), ("minilm-w4-ort", w4, "fp16")]


def build_one(name: str, onnx_path: Path, precision: str, out_dir: Path, seq: tuple[int, int, int]) -> dict:
    from edgeattn.bundle.build import BuildConfig, build

    start = time.perf_counter()
    bundle = build(onnx_path, BuildConfig(target="rtx", precision=precision, out=out_dir / f"{name}.edgeattn",
                                          seq=seq, name=name))
    wall = time.perf_counter() - start
    m = bundle.manifest
    engine = m.sections["engine"]
    return {"name": name, "precision": precision, "wall_s": wall, "builder_s": engine["build_seconds"],
            "engine_mb": bundle.artifact.stat().st_size / 1e6, "layers": m.precision["compute_layers"],
            "fp32": len(m.precision["float_layers"]), "sms": ",".join(engine["applied"].get("compute_capabilities", [])),
            "attention": ", ".join(f"{a['node']}->{a['to']}" for a in engine["attention"]) or "no attention node",
            "problems": m.sections["problems"], "report": bundle.report}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--onnx", action="append", default=[], metavar="NAME=PATH[:PRECISION]",
                    help="an extra ONNX model to build (precision default fp16)")
    ap.add_argument("--only", action="append", choices=sorted(EXPORTS), help="export and build only these")
    ap.add_argument("--no-export", action="store_true", help="build only the --onnx models")
    ap.add_argument("--ort-quantized", action="store_true",
                    help="also build stand-in W8A8 / W4 MiniLM made with onnxruntime.quantization")
    ap.add_argument("--attention", choices=["native", "windowed"], default="native",
                    help="export with edgeattn::WindowedAttention (needs the attention export of edgeattn)")
    ap.add_argument("--seq", default="1:128:512", help="sequence range MIN:OPT:MAX")
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "edgeattn-rtx-builds")
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    seq = tuple(int(x) for x in args.seq.split(":"))
    jobs: list[tuple[str, Path, str]] = []
    if not args.no_export:
        for key in args.only or sorted(EXPORTS):
            alias, precision = EXPORTS[key]
            print(f"exporting {alias} ...", file=sys.stderr, flush=True)
            jobs.append((f"{key}-{precision}", export(alias, args.work / f"{key}-{args.attention}.onnx", args.attention),
                         precision))
    if args.ort_quantized:
        print("quantizing MiniLM with onnxruntime.quantization ...", file=sys.stderr, flush=True)
        jobs += ort_quantized(args.work)
    for spec in args.onnx:
        name, _, rest = spec.partition("=")
        path, _, precision = rest.partition(":")
        jobs.append((name, Path(path), precision or "fp16"))
    rows = []
    for name, path, precision in jobs:
        print(f"building {name} ...", file=sys.stderr, flush=True)
        rows.append(build_one(name, path, precision, args.work, seq))
    print(f"{'model':<16} {'prec':<5} {'wall s':>7} {'builder s':>9} {'engine MB':>9}  compute layers (fp32 left)  attention")
    for r in rows:
        layers = ", ".join(f"{v} {k}" for k, v in r["layers"].items())
        print(f"{r['name']:<16} {r['precision']:<5} {r['wall_s']:>7.1f} {r['builder_s']:>9.1f} {r['engine_mb']:>9.1f}  "
              f"{layers} ({r['fp32']})  {r['attention']}")
        print(f"{'':<16} SMs {r['sms']}; report {r['report']}")
        for p in r["problems"]:
            print(f"{'':<16} problem: {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
