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
@click.option("--decoder", is_flag=True,
              help="A decoder for generation: the KV cache (sinks + ring) as inputs and outputs, the window at run "
                   "time, the tokenizer inside (Llama-family causal LMs; dynamo exporter).")
@click.option("--sinks", default=4, show_default=True, help="--decoder: first tokens kept for the whole stream.")
@click.option("--window-max", default=2048, show_default=True,
              help="--decoder: the ring's default size (the runtime may choose another).")
def export(model, out, exporter, opset, attention, decoder, sinks, window_max):
    """Export MODEL to ONNX: an alias of a packaged model (minilm, smollm2) or a Hugging Face folder."""
    if decoder:
        from edgeattn.decoder.export import DecoderExportConfig, export_decoder

        if exporter != "dynamo" or attention != "native":
            raise click.UsageError("--decoder uses the dynamo exporter and its own attention: drop --exporter "
                                   "and --attention")
        path = export_decoder(model, out, DecoderExportConfig(sinks=sinks, window_max=window_max, opset=opset))
        click.echo(f"wrote {path}")
        return
    from edgeattn.export import ExportConfig, export_hf

    path = export_hf(model, out, ExportConfig(exporter=exporter, opset=opset, attention=attention))
    click.echo(f"wrote {path}")
