"""edgeattn inspect."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
def inspect(bundle, as_json):
    """Show BUNDLE's manifest and report, the pipeline stages that made it (if `edgeattn pipeline` built
    it), and whether its files match their hashes."""
    from rich.console import Console
    from rich.markdown import Markdown

    from edgeattn.bundle.folder import open_bundle
    from edgeattn.errors import BundleError

    b = open_bundle(bundle, verify=False)
    failure = None
    try:
        b.manifest.verify_files(b.path)
        integrity = "all files match the manifest"
    except BundleError as exc:
        failure = exc
        integrity = f"INTEGRITY FAILURE: {exc}"
    if as_json:
        click.echo(b.manifest.to_json(), nl=False)
    else:
        console = Console()
        report = b.report if failure is None and b.report.exists() else None  # an unverified report may lie
        console.print(Markdown(report.read_text(encoding="utf-8") if report else "(report not shown: the bundle "
                               "does not match its manifest)" if failure else "(no report)"))
        layers = b.manifest.precision.get("layers") if isinstance(b.manifest.precision, dict) else None
        if isinstance(layers, dict) and layers:
            console.print(precision_table(layers, b.manifest.precision.get("float")))
        chain = b.manifest.sections.get("pipeline")
        if isinstance(chain, list) and chain:
            console.print(chain_table(chain))
        console.print(f"\nfiles: {len(b.manifest.files)}; {integrity}")
    if failure is not None:
        raise failure


def precision_table(layers: dict, default=None):
    """The manifest's per-layer precision, one row per matrix kind: layers with the same dtype in one range
    (`wqkv 0-29  bf16`)."""
    from rich.table import Table

    groups: dict[tuple[str, str], list[int]] = {}
    for name, dtype in layers.items():
        base, _, index = str(name).rpartition(".")
        key = (base, str(dtype)) if index.isdigit() else (str(name), str(dtype))
        groups.setdefault(key, []).append(int(index) if index.isdigit() else -1)
    title = "precision: per layer" + (f" (float {default})" if default else "")
    table = Table(title=title, title_justify="left")
    for column in ("matrix", "layers", "dtype"):
        table.add_column(column)
    for (name, dtype), indices in groups.items():
        table.add_row(name, _ranges(sorted(i for i in indices if i >= 0)), dtype)
    return table


def _ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'; [] -> '-'."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in runs) or "-"


def chain_table(chain: list):
    """The `pipeline` section: one row per stage, first first (the last one built this bundle)."""
    from rich.table import Table

    table = Table(title="pipeline: the stages that made this bundle", title_justify="left")
    for column in ("stage", "kind", "options", "read (sha256)", "wrote (sha256)", "seconds"):
        table.add_column(column, overflow="fold")
    for entry in chain:
        if not isinstance(entry, dict):
            continue
        outputs = entry.get("outputs")
        wrote = (outputs if isinstance(outputs, str) else
                 "\n".join(f"{k} {str(v)[:12]}" for k, v in (outputs or {}).items()))
        read = "\n".join(f"{k} {str(v)[:12]}" for k, v in (entry.get("inputs") or {}).items())
        seconds = entry.get("seconds")
        table.add_row(str(entry.get("name")), str(entry.get("kind")),
                      "\n".join(_flat(entry.get("options") or {})), read, wrote,
                      f"{seconds:.1f}" if isinstance(seconds, (int, float)) else "-")
    tools = chain[-1].get("tools") if isinstance(chain[-1], dict) else None
    if isinstance(tools, dict):
        table.caption = "tools: " + ", ".join(f"{k} {v}" for k, v in tools.items())
    return table


def _flat(options: dict, prefix: str = "") -> list[str]:
    lines = []
    for key, value in options.items():
        if isinstance(value, dict):
            lines += _flat(value, f"{prefix}{key}.")
        else:
            lines.append(f"{prefix}{key}={json.dumps(value)}")
    return lines
