"""edgeattn check-sparsity."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command("check-sparsity")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the per-layer result as JSON.")
@click.option("--require-all", is_flag=True, help="Fail unless every eligible weight is 2:4.")
def check_sparsity(model, as_json, require_all):
    """Check 2:4 sparsity of every constant weight feeding MatMul, Gemm or Conv in MODEL.onnx.

    Fails (exit 2), naming the layers, when a weight meant to be 2:4 is not: one listed in the model's
    edgeattn.sparse_layers metadata, one that is 2:4 in most groups, or any eligible weight with --require-all.
    """
    import onnx_ir as ir

    from edgeattn import onnx_model
    from edgeattn.errors import ModelError
    from edgeattn.passes.check_sparsity import check_model

    layers = check_model(ir.serde.deserialize_model(onnx_model.load(model)))
    failed = [e for e in layers if e.status == "broken" or (require_all and e.status == "dense")]
    if as_json:
        click.echo(json.dumps({"model": str(model), "ok": not failed,
                               "sparse_layers": [e.layer for e in layers if e.sparse],
                               "layers": [{**e.__dict__, "sparse": e.sparse} for e in layers]}, indent=1))
    else:
        for e in layers:
            click.echo(f"{e.status:8} {e.layer:48} {e.op:7} {str(e.shape):14} {e.reason}")
        counts = {s: sum(e.status == s for e in layers) for s in ("sparse", "dense", "broken", "skipped")}
        click.echo(", ".join(f"{v} {k}" for k, v in counts.items()))
    if failed:
        names = "; ".join(f"{e.layer}: {e.reason}" for e in failed[:5])
        raise ModelError(f"{len(failed)} weight(s) are not 2:4 where expected: {names}")
