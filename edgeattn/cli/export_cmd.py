"""edgeattn export."""

from __future__ import annotations

from contextlib import contextmanager
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
                   "time, the tokenizer inside (rotary causal LMs: Llama, Mistral, Qwen 2/3, Gemma 1/2/3, Phi-3; "
                   "dynamo exporter).")
@click.option("--sinks", default=4, show_default=True, help="--decoder: first tokens kept for the whole stream.")
@click.option("--window-max", default=2048, show_default=True,
              help="--decoder: the ring's default size (the runtime may choose another).")
@click.option("--page", default=0, show_default=True,
              help="--decoder: rows per retrieval page of the attention budget (16: Quest's; it must divide "
                   "--window-max); the model then reads attention_pages and the pages' key bounds. 0: the window "
                   "alone.")
@click.option("--dense-layers", default=0, show_default=True,
              help="--decoder with --page: the first N layers read the whole ring whenever a budget reads pages "
                   "(Quest keeps its first 2 dense); a window alone is unchanged.")
@click.option("--quiet", "-q", is_flag=True, help="--decoder: no progress on stderr, only the result.")
def export(model, out, exporter, opset, attention, decoder, sinks, window_max, page, dense_layers, quiet):
    """Export MODEL to ONNX: an alias of a packaged model (minilm, smollm2) or a Hugging Face folder."""
    if decoder:
        from edgeattn.decoder.export import DecoderExportConfig, export_decoder

        if exporter != "dynamo" or attention != "native":
            raise click.UsageError("--decoder uses the dynamo exporter and its own attention: drop --exporter "
                                   "and --attention")
        with stages(quiet) as progress:
            path = export_decoder(model, out, DecoderExportConfig(sinks=sinks, window_max=window_max, opset=opset,
                                                                  page=page, dense_layers=dense_layers),
                                 progress=progress)
        click.echo(f"wrote {path}")
        return
    if page or dense_layers:
        raise click.UsageError("--page and --dense-layers are for --decoder exports")
    from edgeattn.export import ExportConfig, export_hf

    path = export_hf(model, out, ExportConfig(exporter=exporter, opset=opset, attention=attention))
    click.echo(f"wrote {path}")


@contextmanager
def stages(quiet: bool):
    """A `progress(stage, estimated seconds)` callback drawing each stage on stderr (rich): a spinner, the time
    spent, the estimate; a finished stage stays as one line with its time. Not a terminal: one line a stage."""
    if quiet:
        yield lambda stage, seconds: None
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not console.is_terminal:
        yield lambda stage, seconds: console.print(stage + (f" (about {_duration(seconds)})" if seconds else ""),
                                                   markup=False, highlight=False)
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
               TextColumn("[dim]{task.fields[hint]}"))
    with Progress(*columns, console=console) as bar:
        current = []

        def finish() -> None:
            if current:
                bar.update(current[-1], completed=1, hint="")
                bar.stop_task(current[-1])

        def progress(stage: str, seconds: float | None) -> None:
            finish()
            current.append(bar.add_task(stage, total=1, hint=f"about {_duration(seconds)}" if seconds else ""))

        yield progress
        finish()


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
