"""edgeattn pipeline."""

from __future__ import annotations

from pathlib import Path

import click

STYLE = {"run": "bold", "up to date": "green", "skip": "yellow"}


@click.command()
@click.argument("recipe")
@click.option("--dry-run", is_flag=True, help="Print the plan (what would run, what is up to date, and why); run nothing.")
@click.option("--from", "from_stage", metavar="STAGE", help="Run this stage and every stage after it, up to date or not.")
@click.option("--force", is_flag=True, help="Run every stage, up to date or not.")
@click.option("--work-dir", type=click.Path(path_type=Path),
              help="Folder of the stage outputs [default: the recipe's work_dir, else RECIPE.pipeline beside it; "
                   "for a packaged recipe, in the current folder].")
def pipeline(recipe, dry_run, from_stage, force, work_dir):
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
    with console.status(f"{loaded.name}") as status:
        def show(event):
            if event.what == "progress":
                status.update(f"{event.stage}: {event.text}")
                console.print(f"[dim]{event.stage}: {event.text}[/]", soft_wrap=True)
            elif event.what == "start":
                status.update(f"{event.stage}: running")
                console.print(f"[bold]{event.stage}[/]: running ({event.text})")
            elif event.what == "done":
                console.print(f"[bold]{event.stage}[/]: done in {event.text}")
            else:
                console.print(f"[{STYLE[event.what]}]{event.stage}[/]: {event.what} ({event.text})")

        records = pl.run(loaded, force=force, from_stage=from_stage, on_event=show)
    skipped = sum(1 for s in loaded.stages if s.skip)
    click.echo(f"{loaded.name}: {len(records)} of {len(loaded.stages)} stages up to date"
               f"{f', {skipped} skipped' if skipped else ''}, in {loaded.work_dir}")
    for stage in loaded.stages:
        if stage.name in records and stage.kind in ("build", "export-triton"):
            artifact = dict(stage.parsed.writes)
            click.echo(f"  {stage.name}: {loaded.work_dir / stage.name / next(iter(artifact.values()))}")
