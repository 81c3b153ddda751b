"""edgeattn eval."""

from __future__ import annotations

from pathlib import Path

import click


@click.command(name="eval")
@click.option("--model", "model", required=True, help="The float model: Hugging Face folder or alias.")
@click.option("--onnx", "onnx_path", type=click.Path(path_type=Path, exists=True, dir_okay=False), required=True,
              help="The quantized ONNX (from edgeattn quantize).")
@click.option("--text", type=click.Path(path_type=Path), default=None,
              help="Held-out text, one a line [gensim's pang_lee_polarity (encoders) / lee.cor (decoders)].")
@click.option("--ptq", "ptq_config", default=None,
              help="Also measure post-training quantization with this registered config (e.g. w8a8, w4, fp8).")
@click.option("--block-size", type=int, default=None, help="Block size of --ptq w4.")
@click.option("--calib", type=click.Path(path_type=Path), default=None,
              help="Calibration text for --ptq [gensim's lee_background].")
@click.option("--seq-len", type=int, default=128, show_default=True)
def eval_(model, onnx_path, text, ptq_config, block_size, calib, seq_len):
    """Fidelity of a quantized ONNX against the float model (embedding cosine or perplexity), and against PTQ."""
    from edgeattn.quantize.evaluate import EvalJob, evaluate

    rows = evaluate(EvalJob(model, onnx_path, text, ptq_config, block_size, calib, seq_len),
                    progress=lambda m: click.echo(m, err=True))
    for row in rows:
        click.echo("  ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))


eval = eval_  # the name COMMANDS looks up
