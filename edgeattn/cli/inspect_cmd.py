"""edgeattn inspect."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
def inspect(bundle, as_json):
    """Show BUNDLE's manifest and report, and whether its files match their hashes."""
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
        console.print(Markdown(b.report.read_text(encoding="utf-8") if b.report.exists() else "(no report)"))
        console.print(f"\nfiles: {len(b.manifest.files)}; {integrity}")
    if failure is not None:
        raise failure
