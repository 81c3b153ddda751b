"""edgeattn targets."""

from __future__ import annotations

import click


@click.command()
def targets():
    """List the deployment targets: backend, compute capability, precisions, sparsity, plugin."""
    from edgeattn.targets import TARGETS

    click.echo(f"{'target':10} {'backend':13} {'sm':22} {'precisions':36} {'2:4':4} {'plugin':6} min TRT")
    for t in TARGETS.values():
        sm = ",".join(map(str, t.sm)) or "-"
        click.echo(f"{t.name:10} {t.backend:13} {sm:22} {','.join(t.precisions):36} "
                   f"{'yes' if t.sparse_tensor_cores else 'no':4} {'yes' if t.attention_plugin else 'no':6} {t.min_trt or '-'}")
