"""edgeattn distill-text."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command("distill-text")
@click.option("--model", "model_name", default="smollm2", show_default=True,
              help="Causal LM that writes the text: Hugging Face folder or packaged alias.")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="Text file to write, one document a line.")
@click.option("--docs", default=1024, show_default=True, help="Documents to write.")
@click.option("--max-new-tokens", default=192, show_default=True, help="Length cap of each document, in tokens.")
@click.option("--batch", default=64, show_default=True, help="Documents sampled together.")
@click.option("--temperature", default=0.9, show_default=True)
@click.option("--top-p", default=0.95, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda[:N] (bf16 on CUDA).")
def distill_text(model_name, out, docs, max_new_tokens, batch, temperature, top_p, seed, device):
    """Write distillation text sampled from a language model, across many genres and topics.

    The file feeds `edgeattn sparsify --calib` and `edgeattn quantize --calib` when little real text
    is at hand. A JSON manifest is written beside it (OUT.json).
    """
    from edgeattn import atomic
    from edgeattn.quantize.generated_text import GenerateConfig, write_distill_text

    config = GenerateConfig(docs=docs, max_new_tokens=max_new_tokens, batch=batch, temperature=temperature,
                            top_p=top_p, seed=seed)
    manifest = write_distill_text(model_name, out, config, device, progress=lambda m: click.echo(m, err=True))
    atomic.write_text(out.with_name(out.name + ".json"), json.dumps(manifest, indent=1))
    click.echo(f"wrote {manifest['documents']} documents ({manifest['words']} words) to {out} "
               f"in {manifest['seconds']} s")
