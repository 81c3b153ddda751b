"""edgeattn build."""

from __future__ import annotations

from pathlib import Path

import click

from edgeattn.cli.options import DimType, RangeType
from edgeattn.targets import TARGETS


@click.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--target", default="auto", show_default=True,
              help="auto, or one of: " + ", ".join(TARGETS) + ". auto picks TensorRT when a GPU and TensorRT are present, else cpu.")
@click.option("--out", type=click.Path(path_type=Path), help="Bundle folder [default: MODEL.edgeattn beside the model].")
@click.option("--precision", type=click.Choice(["fp32", "fp16", "bf16", "fp8"]),
              help="Float type of layers the graph does not already quantize [default: fp32; cuda: bf16].")
@click.option("--batch", type=RangeType(), default="1:1:8", show_default=True, help="Batch range.")
@click.option("--seq", type=RangeType(), help="Sequence-length range [default: 1:128:512; decoders: the chunk "
              "length, 1:1:W with W the ring's size; their cache dimension always follows the ring].")
@click.option("--dim", "dims", type=DimType(), multiple=True, help="Range of one named dynamic dimension.")
@click.option("--strict", is_flag=True, help="Fail when a fusion or precision did not happen as asked.")
@click.option("--no-parity", is_flag=True, help="Skip the check against the source model.")
@click.option("--tolerance", type=float, help="Parity tolerance, relative: max abs diff / max abs reference output "
              "[default: 1e-4; quantized graphs 0.05].")
@click.option("--name", help="Model name in the manifest [default: the file's stem].")
@click.option("--attention-body", default="auto", show_default=True, type=click.Choice(["auto", "blocked", "dense"]),
              help="ONNX body of the fused attention op: blocked (cost follows the window), dense (fewest nodes; "
                   "short sequences); auto: dense on ONNX Runtime up to 512 tokens.")
@click.option("--cached-attention", default="ops", show_default=True, type=click.Choice(["ops", "fused"]),
              help="cpu decoders: the cached attention as plain ops (fastest once the window holds a few hundred "
                   "tokens), or fused into ONNX Runtime's GroupQueryAttention (fewer nodes: faster steps at short "
                   "contexts, slower attention at long ones).")
@click.option("--no-fast-path", is_flag=True, help="cpu decoders: leave out the fast path (model.fast_path.onnx) "
              "that runs streams still inside their window without the ring; halves the model's memory.")
@click.option("--window-max", type=click.IntRange(min=1), default=2048, show_default=True,
              help="cuda: the ring's rows per stream (the largest attention window; memory a stream takes).")
@click.option("--sinks", type=click.IntRange(min=0), default=4, show_default=True, help="cuda: sink tokens kept.")
@click.option("--arch", "archs", help="cuda: GPU architectures whose kernels are compiled ahead of time (comma "
              "list, or 'none') [default: sm_87,sm_90,sm_110; with fp8: sm_90,sm_110, as Orin has no FP8].")
@click.option("--kv-cache", type=click.Choice(["fp8"]), help="cuda: an FP8 KV cache (per-head scales calibrated at "
              "build): half the bytes a long-context decode step reads [default: the float type].")
@click.option("--fp8-rounding", type=click.Choice(["gptq", "nearest"]), default="gptq", show_default=True,
              help="cuda, --precision fp8: round the weights with error feedback from calibration text (GPTQ) or "
              "to nearest.")
@click.option("--calibration", type=click.Path(dir_okay=False, path_type=Path), help="cuda, --precision fp8: "
              "calibration text for the rounding, one document a line [default: the lee_background corpus].")
@click.option("--as-inference", is_flag=True, help="Build a model exported in training mode as inference: Dropout "
              "removed, BatchNormalization on running statistics [default: refuse such a model].")
def build(model, target, out, precision, batch, seq, dims, strict, no_parity, tolerance, name, attention_body,
          cached_attention, no_fast_path, window_max, sinks, archs, kv_cache, fp8_rounding, calibration, as_inference):
    """Build a deployable bundle from MODEL (an .onnx file; for --target cuda, a Hugging Face decoder folder or a
    packaged model such as smollm2).

    Validates the model, runs the graph passes (attention fusion and checks), builds the engine or
    optimized model for the target, checks it against the source, and writes a folder with
    manifest.json and report.md. A failed build leaves nothing behind.
    """
    from rich.console import Console

    from edgeattn.bundle.config import BuildConfig, check_inputs
    from edgeattn.targets import get_target

    if target != "auto" and get_target(target).backend == "cuda":
        return _build_cuda(model, out, precision or "bf16", window_max, sinks, archs, name, kv_cache, fp8_rounding,
                           calibration)
    config = BuildConfig(target=target, out=out, precision=precision or "fp32", batch=batch, seq=seq, dims=tuple(dims),
                         strict=strict, parity=not no_parity, parity_tolerance=tolerance, name=name,
                         attention_body=attention_body, cached_attention=cached_attention,
                         fast_path=not no_fast_path, as_inference=as_inference)
    check_inputs(model, config)  # before the model libraries load: a wrong path is said at once
    from edgeattn.bundle.build import build as run_build

    console = Console(stderr=True)
    with console.status("building") as status:
        bundle = run_build(model, config, progress=lambda msg: (status.update(msg), console.print(f"[dim]{msg}[/]")))
    m = bundle.manifest
    for p in m.sections.get("problems", []):
        console.print(f"[yellow]problem:[/] {p}")
    click.echo(f"bundle {bundle.path} (target {m.target['name']}, artifact {m.artifact}); "
               + fusion_summary(m.sections.get("passes", [])))


def _build_cuda(model, out, precision, window_max, sinks, archs, name, kv_cache=None, fp8_rounding="gptq",
                calibration=None) -> None:
    from rich.console import Console

    from edgeattn.bundle.cuda_build import CudaBuildConfig, build_cuda

    if archs is None:
        archs = "sm_90,sm_110" if "fp8" in (precision, kv_cache) else "sm_87,sm_90,sm_110"
    chosen = () if archs.strip().lower() == "none" else tuple(a.strip() for a in archs.split(",") if a.strip())
    config = CudaBuildConfig(out=out or Path(f"{Path(str(model)).name}.cuda.edgeattn"), precision=precision,
                             sinks=sinks, window_max=window_max, archs=chosen, name=name, kv_cache=kv_cache,
                             fp8_rounding=fp8_rounding, calibration=calibration)
    console = Console(stderr=True)
    with console.status("building") as status:
        bundle = build_cuda(str(model), config, progress=lambda msg: (status.update(msg), console.print(f"[dim]{msg}[/]")))
    d = bundle.manifest.sections["decoder"]
    click.echo(f"bundle {bundle.path} (target cuda, {precision}, {d['layers']} layers, ring {sinks} + {window_max} "
               f"rows: {d['cache_bytes_per_stream'] / 2**20:.1f} MiB a stream; kernels for "
               f"{', '.join(chosen) or 'none'})")


def fusion_summary(passes: list[dict]) -> str:
    """'attention 6/6 blocks fused, GELU 6/6 fused, opset 17 -> 18' from the passes' details."""
    by_name = {p["name"]: p.get("details", {}) for p in passes}
    parts = []
    if (att := by_name.get("fuse-attention")) is not None:
        total = att.get("windowed_total", 0) + len(att.get("unfused", []))
        if total or not by_name.get("lower-cached-cpu", {}).get("lowered"):
            parts.append(f"attention {att.get('windowed_total', 0)}/{total} blocks fused" if total else "no attention")
    if lowered := by_name.get("lower-cached-cpu", {}).get("lowered"):
        parts.append(f"cached attention {lowered} layers lowered for ONNX Runtime")
    for name, what in (("fuse-rmsnorm-cpu", "RMSNorm"), ("fuse-rotary-cpu", "RoPE")):
        if fused := by_name.get(name, {}).get("fused"):
            parts.append(f"{what} {fused} fused")
    if (gelu := by_name.get("fuse-gelu-cpu")) and "fused" in gelu:
        done = gelu["fused"] + gelu.get("native", 0)
        if total_gelu := done + gelu.get("unfused", 0):
            parts.append(f"GELU {done}/{total_gelu} fused")
    if (up := by_name.get("upgrade-opset")) and up.get("from") != up.get("to"):
        parts.append(f"opset {up['from']} -> {up['to']}")
    if (inf := by_name.get("inference-mode")) and inf.get("training_nodes"):  # present only when rewritten
        parts.append(f"built as inference ({len(inf['training_nodes'])} training node(s) rewritten)")
    return ", ".join(parts) or "no graph passes"
