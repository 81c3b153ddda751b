"""edgeattn: take transformer models to Jetson (Orin, Thor) and H100-class GPUs.

Stages, each usable alone: quantize / sparsify (PyTorch) -> export (ONNX with
edgeattn::WindowedAttention; --decoder for generation) -> build (a bundle for cpu, rtx, orin, thor,
h100) -> serve / generate. `edgeattn pipeline RECIPE.toml` runs them all.
"""

from __future__ import annotations

import importlib
import sys

import click

from edgeattn import __version__
from edgeattn.errors import EdgeAttnError

# name -> one-line help. The command is the function edgeattn.cli.<name>_cmd.<name> (dashes as underscores),
# imported only when it runs, so `edgeattn --help` loads no torch, TensorRT or Triton.
COMMANDS: dict[str, str] = {
    "export": "Export a Hugging Face model (or a packaged one) to ONNX.",
    "build": "Validate an ONNX model, rewrite it and build a bundle for a target.",
    "bench": "Measure a bundle's latency percentiles and throughput.",
    "inspect": "Show a bundle's manifest and report.",
    "targets": "List the deployment targets and what each supports.",
    "thermal": "Record thermal traces, fit the RC model, simulate and tune window policies.",
    "kernels": "Compile the windowed-attention Triton kernels ahead of time.",
    "export-triton": "Write a Triton Inference Server model repository for a bundle.",
    "serve": "Serve bundles over KServe v2 / Triton HTTP with dynamic batching.",
    "window": "Get, set, lock or unlock a running server's attention window.",
    "sparsify": "Prune Linear weights 2:4 (where it pays), fine-tune with the masks, export ONNX.",
    "check-sparsity": "Check which constant MatMul/Gemm/Conv weights of an ONNX model are 2:4 sparse.",
    "quantize": "QAT to INT8 / INT4 / FP8 with distillation, exported as Q/DQ ONNX.",
    "distill-text": "Write distillation text sampled from a language model (for sparsify / quantize --calib).",
    "generate": "Generate text from a decoder bundle (sinks + ring KV cache).",
    "eval": "Fidelity of a quantized ONNX (--model, --onnx), or long-context accuracy of a decoder bundle (--task).",
    "eval-table": "Long-context accuracy of a decoder bundle over tasks x contexts x attention settings, with a plot.",
    "pipeline": "Run a deployment recipe (export .. build .. export-triton), resumably.",
}


class UserError(click.ClickException):
    """An EdgeAttnError at the CLI boundary: one line on stderr, the error's exit code, no traceback."""

    def __init__(self, error: EdgeAttnError) -> None:
        super().__init__(str(error))
        self.exit_code = error.exit_code


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        attr = name.replace("-", "_")
        return getattr(importlib.import_module(f"edgeattn.cli.{attr}_cmd"), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except EdgeAttnError as exc:
            raise UserError(exc) from None
        except KeyboardInterrupt:
            raise click.ClickException("interrupted; nothing was left half-written") from None


@click.group(cls=LazyGroup, help=__doc__, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edgeattn")
@click.option("-v", "--verbose", count=True,
              help="Show other libraries' warnings and logs (-v); also edgeattn's debug logs (-vv).")
def cli(verbose: int) -> None:
    from edgeattn.cli.verbosity import configure

    configure(verbose)


def main(argv: list[str] | None = None) -> None:
    cli.main(args=argv, prog_name="edgeattn")


if __name__ == "__main__":  # python -m edgeattn.cli.main
    sys.exit(main())
