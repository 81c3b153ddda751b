"""edgeattn eval: the fidelity of a quantized ONNX (--model, --onnx), or a decoder bundle's long-context accuracy
on a synthetic task (BUNDLE --task)."""

from __future__ import annotations

from pathlib import Path

import click

from edgeattn.cli.context_eval import context_options


@click.command(name="eval")
@click.argument("bundle", required=False, type=click.Path(path_type=Path))
@click.option("--model", "model", help="Fidelity: the float model, a Hugging Face folder or alias.")
@click.option("--onnx", "onnx_path", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="Fidelity: the quantized ONNX (from edgeattn quantize).")
@click.option("--text", type=click.Path(path_type=Path), default=None,
              help="Held-out text, one a line [gensim's pang_lee_polarity (encoders) / lee.cor (decoders)].")
@click.option("--ptq", "ptq_config", default=None,
              help="Also measure post-training quantization with this registered config (e.g. w8a8, w4, fp8).")
@click.option("--block-size", type=int, default=None, help="Block size of --ptq w4.")
@click.option("--calib", type=click.Path(path_type=Path), default=None,
              help="Calibration text for --ptq [gensim's lee_background].")
@click.option("--seq-len", type=int, default=128, show_default=True)
@context_options
def eval_(bundle, model, onnx_path, text, ptq_config, block_size, calib, seq_len, task, context, samples, seed,
          window, budget, prompt_form, budget_recent, prompt_attention, max_tokens, window_max, threads, json_out):
    """Fidelity of a quantized ONNX against the float model (--model, --onnx: embedding cosine or perplexity,
    and against PTQ), or long-context accuracy of a decoder BUNDLE on a task (BUNDLE --task: passkey, multikey,
    vartrack) with full attention, a --window or a --budget (docs/evaluation.md)."""
    from edgeattn.errors import InputError

    long_context = bundle is not None or task is not None
    if long_context and (model is not None or onnx_path is not None):
        raise InputError("expected either --model and --onnx (fidelity of a quantized ONNX) or BUNDLE --task "
                         "(long-context accuracy), found both")
    if long_context:
        if bundle is None or task is None:
            raise InputError("expected BUNDLE and --task together (long-context accuracy), found "
                             + ("--task without BUNDLE" if bundle is None else "BUNDLE without --task"))
        if any(v is not None for v in (text, ptq_config, block_size, calib)):
            raise InputError("--text, --ptq, --block-size and --calib apply to --model/--onnx, not to BUNDLE --task")
        if context is None:
            raise InputError("expected --context TOKENS with BUNDLE --task, found none")
        _long_context(bundle, task, context, samples, seed, window, budget, budget_recent, max_tokens, window_max,
                      threads, json_out, prompt_form, prompt_attention)
        return
    if model is None or onnx_path is None:
        raise InputError("expected --model and --onnx (fidelity of a quantized ONNX) or BUNDLE --task "
                         "(long-context accuracy), found " + ("neither" if model is None and onnx_path is None
                                                              else "only one of --model and --onnx"))
    from edgeattn.quantize.evaluate import EvalJob, evaluate

    rows = evaluate(EvalJob(model, onnx_path, text, ptq_config, block_size, calib, seq_len),
                    progress=lambda m: click.echo(m, err=True))
    for row in rows:
        click.echo("  ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))


def _long_context(bundle, task, context, samples, seed, window, budget, recent, max_tokens, window_max, threads,
                  json_out, prompt_form, prompt_attention="budget") -> None:
    import json

    from edgeattn import atomic
    from edgeattn.cli.context_eval import open_generator, render, setting_from
    from edgeattn.cli.progress_display import ProgressDisplay
    from edgeattn.evaluation.runner import EvalConfig, run_eval

    config = EvalConfig(task, context, setting_from(window, budget, recent, prompt_attention), samples, seed, max_tokens,
                        prompt_form=prompt_form)
    with open_generator(bundle, window_max, threads) as gen, ProgressDisplay() as show:
        result = run_eval(gen, config, progress=show)
    click.echo(render(result, gen))
    if json_out is not None:
        atomic.write_text(json_out, json.dumps(result.to_dict(), indent=1) + "\n")
        click.echo(f"wrote {json_out}", err=True)


eval = eval_  # the name COMMANDS looks up
