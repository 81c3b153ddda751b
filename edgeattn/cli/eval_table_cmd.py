"""edgeattn eval-table."""

from __future__ import annotations

from pathlib import Path

import click

from edgeattn.cli.context_eval import run_options


def _csv(kind):
    def convert(ctx, param, value):
        from edgeattn.errors import InputError

        if value is None or value == "":
            return ()
        try:
            return tuple(kind(v.strip()) for v in value.split(",") if v.strip())
        except ValueError:
            raise InputError(f"--{param.name}: expected a comma list, found {value!r}") from None
    return convert


@click.command(name="eval-table")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--tasks", default="passkey", show_default=True, callback=_csv(str),
              help="Comma list of tasks: passkey, multikey, vartrack.")
@click.option("--contexts", default="1024,2048,4096,8192", show_default=True, callback=_csv(int),
              help="Comma list of contexts in tokens (prompt + answer).")
@click.option("--settings", "kinds", default="full,window,budget", show_default=True, callback=_csv(str),
              help="Comma list of setting kinds: full, window, budget.")
@click.option("--divisors", default="2,4,8,16", show_default=True, callback=_csv(int),
              help="Window and budget sizes as context / d for each d ('' for none).")
@click.option("--sizes", default="", callback=_csv(int),
              help="Window and budget sizes in tokens at every context, besides the divisors.")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="The results JSON (rewritten after every run).")
@click.option("--plot", type=click.Path(path_type=Path, dir_okay=False),
              help="Also draw accuracy against rows read (PNG).")
@run_options
def eval_table(bundle, tasks, contexts, kinds, divisors, sizes, out, plot, samples, seed, max_tokens, prompt_form,
               budget_recent, prompt_attention, window_max, threads):
    """Long-context accuracy of a decoder BUNDLE over tasks x contexts x settings: full attention, a window of N
    tokens and a budget of N rows for each size N. Writes the results JSON (--out) and a plot (--plot)."""
    from edgeattn.cli.context_eval import open_generator
    from edgeattn.cli.progress_display import ProgressDisplay
    from edgeattn.evaluation.sweep import SweepConfig, run_sweep

    config = SweepConfig(tasks, contexts, kinds, divisors, sizes, samples, seed, budget_recent, max_tokens,
                         prompt_form, prompt_attention)
    with open_generator(bundle, window_max, threads) as gen, ProgressDisplay() as show:
        manifest = getattr(getattr(gen.model, "bundle", None), "manifest", None)
        about = {"bundle": Path(bundle).name, "model": getattr(manifest, "name", None), "threads": threads}
        results = run_sweep(gen, config, out, plot=plot, progress=show, about=about)
    for r in results:
        click.echo(f"{r.task:9} {r.context:6} {r.setting.label:38} rows {r.rows:6}  accuracy {r.accuracy:.2f} "
                   f"({r.correct}/{len(r.samples)}, {r.seconds:.0f} s)")
    click.echo(f"wrote {out}" + (f" and {plot}" if plot else ""), err=True)
