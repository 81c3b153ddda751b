"""edgeattn quantize."""

from __future__ import annotations

from pathlib import Path

import click

from edgeattn.cli.progress_display import ProgressDisplay
from edgeattn.cli.options import QuantConfigOption


@click.command()
@click.option("--model", "model", required=True, help="Hugging Face folder or packaged alias (minilm, smollm2).")
@click.option("--config", "config_name", required=True, cls=QuantConfigOption)
@click.option("--block-size", type=int, default=None, help="w4 only: 32, 64 or 128 inputs per scale [32].")
@click.option("--calib", type=click.Path(path_type=Path), default=None,
              help="Text file, one text a line, for calibration and QAT [gensim's lee_background].")
@click.option("--steps", type=int, default=200, show_default=True, help="Distillation steps; 0 = calibration only (PTQ).")
@click.option("--batch-size", type=int, default=16, show_default=True)
@click.option("--seq-len", type=int, default=64, show_default=True, help="Tokens per training sequence.")
@click.option("--lr", type=float, default=1e-5, show_default=True, help="Learning rate of the weights.")
@click.option("--scale-lr", type=float, default=1e-3, show_default=True, help="Learning rate of the log step sizes.")
@click.option("--checkpoint-dir", type=click.Path(path_type=Path), default=None,
              help="Write resumable checkpoints here (and resume from one found there).")
@click.option("--smooth", "smooth_alpha", type=float, default=None,
              help="SmoothQuant-style scaling with this alpha (0-1) before quantizing; for W8A8/FP8 on "
                   "Llama-family decoders (0.85 works for SmolLM2).")
@click.option("--min-cosine", type=float, default=None,
              help="Encoders: fail (exit 7, nothing written) below this mean embedding cosine to the float model "
                   "on held-out text.")
@click.option("--max-ppl-increase", type=float, default=None,
              help="Decoders: fail (exit 7, nothing written) above this perplexity increase on held-out text, in percent.")
@click.option("--decoder", is_flag=True, help="Export a decoder for generation (the KV cache as inputs and outputs, "
              "as `edgeattn export MODEL --decoder`).")
@click.option("--sinks", default=4, show_default=True, help="--decoder: first tokens kept for the whole stream.")
@click.option("--window-max", default=2048, show_default=True, help="--decoder: the ring's default size.")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output Q/DQ .onnx file.")
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr (the result lines still print).")
def quantize(model, config_name, block_size, calib, steps, batch_size, seq_len, lr, scale_lr, checkpoint_dir,
             smooth_alpha, min_cosine, max_ppl_increase, decoder, sinks, window_max, out, quiet):
    """Quantization-aware training with distillation, exported as Q/DQ ONNX for TensorRT and ONNX Runtime."""
    from edgeattn import text
    from edgeattn.quantize.config import config_from_name
    from edgeattn.quantize.pipeline import QuantizeJob, run_quantize

    config = config_from_name(config_name, block_size=block_size)
    texts = tuple(text.read_lines(calib)) if calib is not None else ()
    job = QuantizeJob(model, config, out, texts=texts, steps=steps, batch_size=batch_size, seq_len=seq_len,
                      lr=lr, scale_lr=scale_lr, checkpoint_dir=checkpoint_dir, smooth_alpha=smooth_alpha,
                      min_cosine=min_cosine, max_ppl_increase=max_ppl_increase, decoder=decoder, sinks=sinks,
                      window_max=window_max)
    with ProgressDisplay(quiet=quiet) as progress:
        result = run_quantize(job, progress=progress)
    s = result.section
    if s["onnx"]:
        click.echo(f"wrote {out}: {s['onnx']['quantized_matmuls']} quantized MatMuls "
                   f"({', '.join(f'{k} {v}' for k, v in s['onnx']['weight_types'].items())} weights, "
                   f"{s['onnx']['activation_qdq']} activation Q/DQ), {len(s['layers']['float_layers'])} Linear left in float")
    if s["fidelity"]:  # the measurement itself went to the progress lines
        from edgeattn.quantize.fidelity import far_warning

        warning = far_warning(s["fidelity"], "quantize", f"{steps} QAT steps")
        if warning:
            click.echo(warning)
