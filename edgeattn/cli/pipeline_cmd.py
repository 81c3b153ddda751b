"""edgeattn pipeline."""

from __future__ import annotations

from pathlib import Path

import click

from edgeattn.cli.progress_display import ProgressDisplay
from edgeattn.quantize.progress import StepProgress

STYLE = {"run": "bold", "up to date": "green", "skip": "yellow"}


@click.command()
@click.argument("recipe")
@click.option("--dry-run", is_flag=True, help="Print the plan (what would run, what is up to date, and why); run nothing.")
@click.option("--from", "from_stage", metavar="STAGE", help="Run this stage and every stage after it, up to date or not.")
@click.option("--force", is_flag=True, help="Run every stage, up to date or not.")
@click.option("--work-dir", type=click.Path(path_type=Path),
              help="Folder of the stage outputs [default: the recipe's work_dir, else RECIPE.pipeline beside it; "
                   "for a packaged recipe, in the current folder].")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines or bars within stages (each stage's start and end still print).")
def pipeline(recipe, dry_run, from_stage, force, work_dir, quiet):
    """Run the deployment RECIPE describes: export, sparsify, quantize, build, export-triton, in order.

    RECIPE is a TOML file or the name of a packaged recipe (minilm-2to4-w8a8, smollm2-w4-thor). The whole
    recipe is checked before anything runs. A stage runs only when its options, its inputs or edgeattn
    changed, or its outputs were altered; each writes into a staging folder renamed into place on
    success, so a run stopped in the middle resumes with that stage. Every bundle's manifest carries the
    chain of stages that made it (`edgeattn inspect`).
    """
    from rich.console import Console
    from rich.table import Table

    from edgeattn import pipeline as pl

    path = Path(recipe)
    if path.is_file():
        loaded = pl.load(path, work_dir=work_dir)
    else:
        from edgeattn import recipes

        loaded = pl.load(recipes.find(recipe), work_dir=work_dir or Path.cwd() / f"{Path(recipe).stem}.pipeline",
                         base=Path.cwd())
    console = Console(stderr=True)
    for note in loaded.notes:
        console.print(f"[yellow]note:[/] {note}")
    if dry_run:
        table = Table(title=f"{loaded.name}: plan ({loaded.work_dir})")
        for column in ("stage", "kind", "action", "why"):
            table.add_column(column)
        for step in pl.plan(loaded, force=force, from_stage=from_stage):
            table.add_row(step.stage.name, step.stage.kind, f"[{STYLE[step.action]}]{step.action}[/]", step.reason)
        Console().print(table)
        return
    actions: dict[str, list[str]] = {"done": [], "up to date": [], "skip": []}
    with ProgressDisplay(quiet=quiet, console=console) as progress:
        def show(event):
            if event.what in actions:
                actions[event.what].append(event.stage)
            if event.what == "progress":
                progress(event.text if isinstance(event.text, StepProgress) else f"{event.stage}: {event.text}")
            elif event.what == "start":
                console.print(f"[bold]{event.stage}[/]: running ({event.text})")
            elif event.what == "done":
                console.print(f"[bold]{event.stage}[/]: done in {event.text}")
            else:
                console.print(f"[{STYLE[event.what]}]{event.stage}[/]: {event.what} ({event.text})")

        records = pl.run(loaded, force=force, from_stage=from_stage, on_event=show)
    from edgeattn.pipeline import summary

    click.echo(summary.run_line(loaded.name, actions["done"], actions["up to date"], actions["skip"],
                                loaded.work_dir))
    bundles = {}
    for stage in loaded.stages:
        if stage.name in records and stage.kind in ("build", "export-triton"):
            artifact = dict(stage.parsed.writes)
            path = loaded.work_dir / stage.name / next(iter(artifact.values()))
            click.echo(f"  {stage.name}: {path}")
            if stage.kind == "build":
                bundles[stage.name] = path
    for line in (summary.fidelity_warnings(dict(loaded.expect), records, loaded.name)
                 + summary.problem_lines(records, bundles)):
        console.print(f"[yellow]warning:[/] {line}", soft_wrap=True)
