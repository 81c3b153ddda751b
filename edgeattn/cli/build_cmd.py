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
@click.option("--precision", default="fp32", show_default=True, type=click.Choice(["fp32", "fp16", "bf16", "fp8"]),
              help="Float type of layers the graph does not already quantize.")
@click.option("--batch", type=RangeType(), default="1:1:8", show_default=True, help="Batch range.")
@click.option("--seq", type=RangeType(), default="1:128:512", show_default=True, help="Sequence-length range.")
@click.option("--dim", "dims", type=DimType(), multiple=True, help="Range of one named dynamic dimension.")
@click.option("--strict", is_flag=True, help="Fail when a fusion or precision did not happen as asked.")
@click.option("--no-parity", is_flag=True, help="Skip the check against the source model.")
@click.option("--tolerance", type=float, help="Parity tolerance, max abs diff [default: 1e-4; for quantized graphs "
              "5% of the largest output magnitude].")
@click.option("--name", help="Model name in the manifest [default: the file's stem].")
@click.option("--attention-body", default="auto", show_default=True, type=click.Choice(["auto", "blocked", "dense"]),
              help="ONNX body of the fused attention op: blocked (cost follows the window), dense (fewest nodes; "
                   "short sequences); auto: dense on ONNX Runtime up to 512 tokens.")
def build(model, target, out, precision, batch, seq, dims, strict, no_parity, tolerance, name, attention_body):
    """Build a deployable bundle from MODEL (an .onnx file).

    Validates the model, runs the graph passes (attention fusion and checks), builds the engine or
    optimized model for the target, checks it against the source, and writes a folder with
    manifest.json and report.md. A failed build leaves nothing behind.
    """
    from rich.console import Console

    from edgeattn.bundle.build import BuildConfig
    from edgeattn.bundle.build import build as run_build

    console = Console(stderr=True)
    config = BuildConfig(target=target, out=out, precision=precision, batch=batch, seq=seq, dims=tuple(dims),
                         strict=strict, parity=not no_parity, parity_tolerance=tolerance, name=name,
                         attention_body=attention_body)
    with console.status("building") as status:
        bundle = run_build(model, config, progress=lambda msg: (status.update(msg), console.print(f"[dim]{msg}[/]")))
    m = bundle.manifest
    for p in m.sections.get("problems", []):
        console.print(f"[yellow]problem:[/] {p}")
    click.echo(f"bundle {bundle.path} (target {m.target['name']}, artifact {m.artifact})")
