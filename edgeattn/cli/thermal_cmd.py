"""edgeattn thermal: record a trace, fit the RC model, simulate and tune window policies."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.group()
def thermal():
    """Thermal-aware runtime: record sensor traces, fit the device's RC model, simulate and tune policies."""


@thermal.command()
@click.option("--source", type=click.Choice(["auto", "sysfs", "nvml"]), default="auto", show_default=True)
@click.option("--seconds", type=float, required=True, help="How long to record.")
@click.option("--hz", type=float, default=2.0, show_default=True, help="Samples per second.")
@click.option("--gpu", type=int, default=0, show_default=True, help="NVML device index.")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Trace CSV (t, temp_c, power_w, ...).")
def record(source, seconds, hz, gpu, out):
    """Record temperature, power, clocks and throttle state to a CSV trace."""
    from edgeattn.runtime.thermal.sensors import open_sensor
    from edgeattn.runtime.thermal.sensors.trace import record as run_record

    sensor = open_sensor(source, gpu)
    try:
        rows = run_record(sensor, seconds, out, hz=hz)
    finally:
        sensor.close()
    click.echo(f"wrote {rows} rows to {out} (trip point {sensor.trip_c if sensor.trip_c is not None else 'unknown'} C)")


@thermal.command()
@click.argument("trace", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--out", type=click.Path(path_type=Path), help="Also write the JSON object to this file.")
def fit(trace, as_json, out):
    """Identify the first-order RC thermal model (R, C, ambient) from TRACE."""
    from edgeattn import atomic
    from edgeattn.runtime.thermal.offline.fit import fit_rc
    from edgeattn.runtime.thermal.sensors.trace import read_trace

    result = fit_rc(read_trace(trace))
    text = json.dumps(result.to_dict(), indent=None if as_json else 2)
    if out:
        atomic.write_text(out, text + "\n")
    if as_json:
        click.echo(text)
    else:
        click.echo(f"R = {result.r_c_per_w:.4g} C/W, C = {result.c_j_per_c:.4g} J/C, tau = {result.tau_s:.4g} s, "
                   f"ambient = {result.ambient_c:.2f} C, fit error (RMSE) = {result.rmse_c:.3f} C "
                   f"over {result.samples} samples / {result.duration_s:.0f} s")
        for note in result.notes:
            click.echo(f"note: {note}")


def _model(path: Path):
    from edgeattn.errors import InputError
    from edgeattn.runtime.thermal.offline.fit import load_model

    if not Path(path).is_file():
        raise InputError(f"model {path}: file not found (write one with `edgeattn thermal fit TRACE --out FIT.json`)")
    try:
        data = json.loads(Path(path).read_text())
    except ValueError as exc:
        raise InputError(f"model {path}: not JSON: {exc}") from exc
    return load_model(data, str(path))


@thermal.command()
@click.option("--model", "model_path", type=click.Path(path_type=Path), required=True, help="FIT.json from `fit --out`.")
@click.option("--policy", "policy_path", type=click.Path(path_type=Path), required=True, help="Policy file (.toml/.yaml/.json).")
@click.option("--workload", default="hot-ambient", show_default=True, help="Preset (hot-ambient, mild) or a workload file.")
@click.option("--quality", "quality_path", type=click.Path(path_type=Path), help="Window -> quality table [default: shipped SmolLM2].")
@click.option("--seed", type=int, help="Sensor-noise seed [default: the workload's].")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Folder for summary.json, simulation.png, series.csv.")
def simulate(model_path, policy_path, workload, quality_path, seed, out):
    """Replay a workload through a policy on the simulated device; plot it and summarize."""
    from edgeattn.runtime.thermal.policy_file import load_policy
    from edgeattn.runtime.thermal.offline.quality import load_table
    from edgeattn.runtime.thermal.offline.simulate import simulate as run, write_outputs
    from edgeattn.runtime.thermal.offline.workload import load_workload

    model, policy, load = _model(model_path), load_policy(policy_path), load_workload(workload)
    result = run(model, policy, load, load_table(quality_path), seed=seed)
    write_outputs(result, out, title=f"{policy.kind} policy, workload {load.name}",
                  extra={"policy": policy.kind, "workload": load.name})
    s = result.summary
    click.echo(f"max {s.max_temp_c:.1f} C (trip {s.trip_c:g}), {s.trip_crossings} trip crossings, "
               f"{_mean_budget(policy.budget, s.mean_window_fraction, s.mean_pages)}, "
               f"{s.window_changes_per_min:.2f} changes/min, quality-weighted throughput "
               f"{s.quality_weighted_throughput:.3f} -> {out}")


def _mean_budget(split, fraction: float, pages: float | None = None) -> str:
    """'mean window F', or for a policy that splits its budget, the budget, its split and its pages."""
    if split.window_only:
        return f"mean window {fraction:.3f}"
    shown = f"mean budget {fraction:.3f} (recent {split.recent:g}"
    return shown + (f", {pages:.1f} pages of {split.page} on average)" if pages is not None else ")")


@thermal.command()
@click.option("--model", "model_path", type=click.Path(path_type=Path), required=True, help="FIT.json from `fit --out`.")
@click.option("--workload", default="hot-ambient", show_default=True, help="Preset (hot-ambient, mild) or a workload file.")
@click.option("--quality", "quality_path", type=click.Path(path_type=Path), help="Window -> quality table [default: shipped SmolLM2].")
@click.option("--seeds", type=int, default=2, show_default=True, help="Sensor-noise seeds each candidate must survive.")
@click.option("--max-changes-per-min", type=float, default=2.0, show_default=True)
@click.option("--r-error", type=float, default=0.05, show_default=True,
              help="Also require zero crossings on a device whose R is this fraction above the fit.")
@click.option("--quick", is_flag=True, help="A small search grid (for smoke tests).")
@click.option("--budget-recent", type=click.FloatRange(0.0, 1.0), default=1.0, show_default=True,
              help="Share of each level's rows given to the recent window, the rest to retrieval pages "
                   "(1 = the window alone); written to the policy as budget = {recent = ...}.")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Policy file to write (.toml or .json).")
def tune(model_path, workload, quality_path, seeds, max_changes_per_min, r_error, quick, budget_recent, out):
    """Search predictive-policy parameters: best quality-weighted throughput with zero trip crossings."""
    from edgeattn.runtime.thermal.policies import BudgetSplit
    from edgeattn.runtime.thermal.policy_file import save_policy
    from edgeattn.runtime.thermal.offline.quality import load_table
    from edgeattn.runtime.thermal.offline.tune import TuneConfig
    from edgeattn.runtime.thermal.offline.tune import tune as run
    from edgeattn.runtime.thermal.offline.workload import load_workload

    r_errors = (0.0, r_error) if r_error else (0.0,)
    split = BudgetSplit(recent=budget_recent)
    config = TuneConfig(seeds=tuple(range(seeds)), r_errors=r_errors, max_changes_per_min=max_changes_per_min,
                        budget=split)
    if quick:
        config = TuneConfig(margins_c=(2.0, 5.0), horizons_s=(60.0,), min_holds_s=(30.0,), up_margins_c=(2.0,),
                            level_sets=((1.0, 0.5, 0.25),), seeds=config.seeds, r_errors=(0.0,),
                            max_changes_per_min=max_changes_per_min, budget=split)
    model, load = _model(model_path), load_workload(workload)
    best, trials = run(model, load, load_table(quality_path), config)
    save_policy(best.policy, out, comment=f"tuned by edgeattn thermal tune on workload {load.name}: quality-weighted "
                f"throughput {best.score:.4f}, {_mean_budget(split, best.mean_window)}, {best.changes_per_min:.2f} changes/min, "
                f"0 trip crossings over {len(config.seeds)} seeds x R errors {list(config.r_errors)} ({len(trials)} candidates)")
    click.echo(f"best of {len(trials)}: quality-weighted throughput {best.score:.4f}, "
               f"{_mean_budget(split, best.mean_window)}, "
               f"{best.changes_per_min:.2f} changes/min, margin {best.policy.margin_c:g} C, horizon "
               f"{best.policy.horizon_s:g} s, levels {list(best.policy.levels)} -> {out}")


@thermal.command()
@click.option("--table", "table_path", type=click.Path(path_type=Path), help="A table JSON [default: shipped SmolLM2].")
@click.option("--measure", is_flag=True, help="Measure SmolLM2 perplexity per window (imports torch; minutes on CPU).")
@click.option("--chunks", type=int, default=3, show_default=True, help="512-token held-out chunks to measure on.")
@click.option("--out", type=click.Path(path_type=Path), help="Write the measured table here.")
def quality(table_path, measure, chunks, out):
    """Show (or measure) the window -> quality table that `tune` uses."""
    from edgeattn import atomic
    from edgeattn.runtime.thermal.offline.quality import load_table, measure_perplexity

    table = measure_perplexity(chunks=chunks) if measure else load_table(table_path)
    click.echo(f"{table.model}: {table.metric} per window ({table.sinks} sinks, max window {table.max_window})")
    click.echo(f"  full   {table.full:8.3f}  quality 1.000")
    for w, v in sorted(table.windows.items(), reverse=True):
        click.echo(f"  W{w:<5} {v:8.3f}  quality {table.quality(w / table.max_window):.3f}")
    if out:
        atomic.write_text(out, json.dumps(table.to_dict(), indent=1) + "\n")
