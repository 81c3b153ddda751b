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
        chain = b.manifest.sections.get("pipeline")
        if isinstance(chain, list) and chain:
            console.print(chain_table(chain))
        console.print(f"\nfiles: {len(b.manifest.files)}; {integrity}")
    if failure is not None:
        raise failure


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
