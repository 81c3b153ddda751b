"""edgeattn kernels: ahead-of-time builds of the windowed-attention Triton kernels."""

from __future__ import annotations

from pathlib import Path

import click


@click.group()
def kernels():
    """Build the windowed-attention Triton kernels ahead of time (PTX + cubin, no GPU needed)."""


@kernels.command("compile")
@click.option("--arch", "archs", default="sm_87,sm_90", show_default=True,
              help="Comma list of sm_87 (Orin), sm_90 (H100/H200), sm_110 (Thor).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Folder to write (replaced atomically): <variant>.<arch>.ptx/.cubin and index.json.")
@click.option("--only", default="", help="Comma list of fnmatch patterns over variant names, e.g. 'prefill-bf16-*'.")
@click.option("--ptx-version", type=int, default=None, help="Pin the PTX ISA (e.g. 85 for older Jetson drivers).")
def compile_cmd(archs: str, out_dir: Path, only: str, ptx_version: int | None):
    """Compile every kernel variant for each arch and write a JSON index."""
    from edgeattn.plugins.kernels.aot import CompileConfig, compile_all

    config = CompileConfig(out_dir=out_dir, archs=tuple(a.strip() for a in archs.split(",") if a.strip()),
                           only=tuple(p.strip() for p in only.split(",") if p.strip()), ptx_version=ptx_version)
    index = compile_all(config)
    for row in index["kernels"]:
        click.echo(f"{row['variant']:36} {row['arch']:7} {row['ptx_target']:8} warps={row['num_warps']} "
                   f"shared={row['shared']}")
    click.echo(f"wrote {len(index['kernels'])} kernels and index.json to {out_dir}")
