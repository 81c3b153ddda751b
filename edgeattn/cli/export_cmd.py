"""edgeattn export."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.argument("model")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output .onnx file.")
@click.option("--exporter", type=click.Choice(["dynamo", "torchscript"]), default="dynamo", show_default=True)
@click.option("--opset", default=18, show_default=True)
@click.option("--attention", type=click.Choice(["native", "windowed"]), default="native", show_default=True,
              help="windowed: replace the model's attention with edgeattn::WindowedAttention.")
def export(model, out, exporter, opset, attention):
    """Export MODEL to ONNX: an alias of a packaged model (minilm, smollm2) or a Hugging Face folder."""
    from edgeattn.export import ExportConfig, export_hf

    path = export_hf(model, out, ExportConfig(exporter=exporter, opset=opset, attention=attention))
    click.echo(f"wrote {path}")
