"""What `edgeattn build` fuses in the ONNX files the common exporters write: exporter x opset x model.

    python benchmarks/fusion_table.py [--models minilm,smollm2] [--rows ts14,ts17-eager,...] [--json OUT]

For each row it exports the packaged model (MiniLM: all-MiniLM-L6-v2, 6 layers; SmolLM2: SmolLM2-135M,
30 layers) with the named exporter, opset and transformers attention implementation, builds a cpu bundle
(not strict: the table reports what was left) and prints a markdown table: attention blocks fused,
GELUs fused (or written as the opset-20 Gelu op), the opset upgrade, and parity against the exported
file. SmolLM2 uses SiLU, so its GELU column is "-". Took 45 minutes on a busy 2-core machine (the dynamo
exports of SmolLM2 most of it); docs/attention-fusion.md holds the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

# name -> (exporter, opset, attention implementation). sdpa is transformers' default: what a stock export gets
ROWS: dict[str, tuple[str, int, str]] = {
    "ts14": ("torchscript", 14, "sdpa"),
    "ts15": ("torchscript", 15, "sdpa"),
    "ts16": ("torchscript", 16, "sdpa"),
    "ts17": ("torchscript", 17, "sdpa"),
    "ts17-eager": ("torchscript", 17, "eager"),
    "dynamo18-eager": ("dynamo", 18, "eager"),
    "dynamo18": ("dynamo", 18, "sdpa"),
    "dynamo20": ("dynamo", 20, "sdpa"),
    "dynamo23": ("dynamo", 23, "sdpa"),  # the Attention op
}
SHAPES = {"minilm": (1, 32, 128), "smollm2": (1, 16, 64)}  # build sequence ranges
DEFAULT_ROWS = {"minilm": list(ROWS), "smollm2": ["ts14", "ts17", "ts17-eager", "dynamo18", "dynamo23"]}


def measure(model_name: str, row: str, folder: Path) -> dict:
    """Export one (model, row) and build it; the numbers for one table line."""
    from edgeattn import hf_models
    from edgeattn.bundle.build import BuildConfig, build
    from edgeattn.export import ExportConfig, export_module

    exporter, opset, attn = ROWS[row]
    line = {"model": model_name, "exporter": exporter, "opset": opset, "attention": attn}
    model, _, kind = hf_models.load(model_name, attn_implementation=attn)
    start = time.perf_counter()
    try:
        path = export_module(model, kind, folder / f"{model_name}-{row}.onnx",
                             ExportConfig(exporter=exporter, opset=opset))
    except Exception as exc:  # a row the exporter cannot write is a table entry, not a crash
        return {**line, "error": f"export failed: {str(exc).splitlines()[0][:120]}"}
    line["export_s"] = round(time.perf_counter() - start, 1)
    try:
        bundle = build(path, BuildConfig(target="cpu", out=folder / f"{model_name}-{row}.edgeattn",
                                         seq=SHAPES[model_name]))
    except Exception as exc:
        return {**line, "error": f"build failed: {str(exc).splitlines()[0][:120]}"}
    passes = {p["name"]: p["details"] for p in bundle.manifest.sections["passes"]}
    att, gelu, up = passes["fuse-attention"], passes["fuse-gelu-cpu"], passes["upgrade-opset"]
    parity = bundle.manifest.sections["parity"]
    return {**line, "blocks_fused": att["windowed_total"], "blocks": att["windowed_total"] + len(att["unfused"]),
            "gelu_fused": gelu["fused"] + gelu["native"], "gelu_native": gelu["native"],
            "gelus": gelu["fused"] + gelu["native"] + gelu["unfused"],
            "upgraded_from": up["from"] if up["from"] != up["to"] else None,
            "parity": parity["status"], "max_abs_diff": parity.get("max_abs_diff")}


def render(lines: list[dict]) -> str:
    out = ["| model | exporter | opset | attention | blocks fused | GELUs fused | opset upgrade | parity (max abs) |",
           "|---|---|---|---|---|---|---|---|"]
    for x in lines:
        head = f"| {x['model']} | {x['exporter']} | {x['opset']} | {x['attention']} |"
        if "error" in x:
            out.append(f"{head} {x['error']} | | | |")
            continue
        gelu = f"{x['gelu_fused']}/{x['gelus']}" + (" (Gelu op)" if x["gelu_native"] else "") if x["gelus"] else "-"
        upgrade = f"{x['upgraded_from']} -> 18" if x["upgraded_from"] else "-"
        parity = f"{x['parity']} ({x['max_abs_diff']:.1e})"
        out.append(f"{head} {x['blocks_fused']}/{x['blocks']} | {gelu} | {upgrade} | {parity} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="minilm,smollm2")
    parser.add_argument("--rows", help=f"comma-separated, of: {', '.join(ROWS)} [default: per model]")
    parser.add_argument("--json", type=Path, help="also write the lines as JSON")
    args = parser.parse_args(argv)
    lines = []
    for model_name in args.models.split(","):
        for row in (args.rows.split(",") if args.rows else DEFAULT_ROWS[model_name]):
            with tempfile.TemporaryDirectory() as tmp:  # one row's export and bundle at a time (SmolLM2: 0.5 GB)
                lines.append(measure(model_name, row, Path(tmp)))
            print(json.dumps(lines[-1]), file=sys.stderr, flush=True)
    if args.json:
        args.json.write_text(json.dumps(lines, indent=1) + "\n")
    print(render(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
