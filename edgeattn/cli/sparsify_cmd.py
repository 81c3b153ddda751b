"""edgeattn sparsify."""

from __future__ import annotations

from pathlib import Path

import click

from edgeattn.cli.options import QuantConfigChoice
from edgeattn.cli.progress_display import ProgressDisplay


@click.command()
@click.option("--model", "model_name", required=True,
              help="Hugging Face folder, or a packaged alias (minilm, smollm2).")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output .onnx file.")
@click.option("--finetune-steps", default=0, show_default=True, help="Distillation steps with the masks on.")
@click.option("--calib", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="Text file, one document a line (default: gensim's lee_background news corpus).")
@click.option("--policy", type=click.Choice(["all", "speed"]), default="all", show_default=True,
              help="all: every eligible Linear; speed: only shapes where the speed table says 2:4 gains.")
@click.option("--method", type=click.Choice(["magnitude", "calibrated", "sequential"]), default="calibrated",
              show_default=True,
              help="calibrated: OBS saliency with error compensation (SparseGPT recipe) from --calib text; "
                   "sequential: the same block by block, on the inputs of the already-pruned layers.")
@click.option("--tokens", default=2048, show_default=True, help="Tokens per GEMM (batch x sequence) for --policy speed.")
@click.option("--gemm-dtype", type=click.Choice(["int8", "fp16"]), default="int8", show_default=True)
@click.option("--speed-table", type=click.Path(exists=True, dir_okay=False),
              help="JSON from benchmarks/sparse_speed_h200.py (default: the packaged H200 table).")
@click.option("--permute", is_flag=True, help="Search input-channel permutations that keep more magnitude.")
@click.option("--skip", multiple=True, help="Module name pattern (fnmatch) never pruned; repeatable.")
@click.option("--lr", default=1e-4, show_default=True)
@click.option("--batch", default=16, show_default=True)
@click.option("--seq-len", default=128, show_default=True,
              help="Tokens per fine-tuning window (decoders) or the longest sentence (encoders); decoders "
                   "recover best when fine-tuned at the context length they will run at.")
@click.option("--qat", type=QuantConfigChoice(),
              help="Then quantization-aware training (edgeattn quantize) with this config, masks kept; exports Q/DQ ONNX.")
@click.option("--qat-steps", default=100, show_default=True)
@click.option("--device", default="cpu", show_default=True, help="Prune and fine-tune on cpu, cuda or cuda:N.")
@click.option("--bf16", is_flag=True, help="bf16 autocast in fine-tuning (CUDA).")
@click.option("--time-budget-s", type=float, help="Stop fine-tuning after this many seconds; the learning rate decays over them.")
@click.option("--calib-batches", default=8, show_default=True, help="Batches of 8 texts for calibrated masks.")
@click.option("--save-hf", type=click.Path(path_type=Path),
              help="Also save the pruned checkpoint, e.g. as input of `edgeattn quantize`.")
@click.option("--min-cosine", type=float, default=None,
              help="Encoders: fail (exit 7, nothing written) below this mean embedding cosine to the dense model "
                   "on held-out text.")
@click.option("--max-ppl-increase", type=float, default=None,
              help="Decoders: fail (exit 7, nothing written) above this perplexity increase on held-out text, in percent.")
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr (the result lines still print).")
def sparsify(model_name, out, finetune_steps, calib, policy, method, tokens, gemm_dtype, speed_table, permute,
             skip, lr, batch, seq_len, qat, qat_steps, device, bf16, time_budget_s, calib_batches, save_hf,
             min_cosine, max_ppl_increase, quiet):
    """Prune Linear weights to 2:4 along K, fine-tune with the masks, export ONNX with the masked weights."""
    from edgeattn.quantize.fidelity import far_warning
    from edgeattn.quantize.sparsity.masks import SparsityConfig
    from edgeattn.quantize.sparsity.pipeline import SIDECAR_SUFFIX, SparsifyJob, run_sparsify

    job = SparsifyJob(
        sparsity=SparsityConfig(policy=policy, method=method, tokens=tokens, gemm_dtype=gemm_dtype,
                                speed_table=speed_table, permute=permute, skip=tuple(skip)),
        finetune_steps=finetune_steps, lr=lr, batch=batch, seq_len=seq_len, bf16=bf16, time_budget_s=time_budget_s,
        device=device, calib_batches=calib_batches,
        calib=str(calib) if calib else None, save_hf=str(save_hf) if save_hf else None,
        qat=qat, qat_steps=qat_steps if qat else 0, min_cosine=min_cosine, max_ppl_increase=max_ppl_increase)
    with ProgressDisplay(quiet=quiet) as progress:
        section = run_sparsify(model_name, out, job, progress=progress)
    layers = section["sparsity"]["layers"]
    for d in layers:
        click.echo(f"{'2:4  ' if d['pruned'] else 'dense'} {d['name']:48} {d['out_features']}x{d['in_features']:<6} {d['reason']}")
    click.echo(f"pruned {len(section['sparsity']['pruned'])} of {len(layers)} Linear layers; wrote {out} "
               f"and {out.name}{SIDECAR_SUFFIX}")
    steps_run = section.get("finetune", {}).get("steps_run", 0)
    ran = f"{steps_run} fine-tuning steps" + (f", then {qat_steps} {qat} QAT steps" if qat else "")
    warning = far_warning(section["fidelity"], "sparsify", ran)  # the measurement went to the progress lines
    if warning:
        click.echo(warning)
