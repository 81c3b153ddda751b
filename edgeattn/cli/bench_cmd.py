"""edgeattn bench."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--batch", type=int, help="Batch size [default: the bundle's opt; cuda bundles: streams, 1].")
@click.option("--seq", type=int, help="Sequence length [default: the bundle's opt; cuda bundles: prompt tokens, 128].")
@click.option("--window", type=int, help="Attention window for bundles that take one (0 = full).")
@click.option("--warmup", default=10, show_default=True, help="Untimed runs first.")
@click.option("--iterations", type=int, help="Timed runs [default: 100; cuda bundles: decode steps, 128].")
@click.option("--duration", type=float, help="Run for this many seconds instead of a fixed count.")
@click.option("--threads", default=0, help="Intra-op threads (0: runtime default).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench(bundle, batch, seq, window, warmup, iterations, duration, threads, as_json):
    """Time BUNDLE: latency min/mean/p50/p90/p99 and throughput (refuses a tampered bundle).

    A cuda bundle is timed through the decode engine on the GPU: --batch streams of --seq random prompt tokens,
    each prefilled in one chunk, then --iterations decode steps of every stream (end of text ignored): the time
    to first token and decode tokens/s."""
    from edgeattn.bench import BenchConfig, run

    config = BenchConfig(batch=batch, seq=seq, warmup=warmup, iterations=iterations, duration=duration,
                         window=window, threads=threads)
    stats = run(bundle, config).stats()
    if as_json:
        click.echo(json.dumps(stats))
        return
    sizes = ", ".join(f"{k}={v}" for k, v in stats["sizes"].items())
    window_text = "" if stats["window"] is None else f", window {stats['window']}"
    click.echo(f"{stats['bundle']} on {stats['backend']} ({sizes}{window_text}), {stats['iterations']} runs")
    if stats.get("kind") == "decoder":
        click.echo("decode step ms: min {min_ms:.3f}  mean {mean_ms:.3f}  p50 {p50_ms:.3f}  p90 {p90_ms:.3f}  "
                   "p99 {p99_ms:.3f}  max {max_ms:.3f}".format(**stats))
        click.echo("decode: {decode_tokens_per_s:.1f} tokens/s; time to first token ms: mean {ttft_mean_ms:.2f}  "
                   "max {ttft_max_ms:.2f}".format(**stats))
        return
    click.echo("latency ms: min {min_ms:.3f}  mean {mean_ms:.3f}  p50 {p50_ms:.3f}  p90 {p90_ms:.3f}  "
               "p99 {p99_ms:.3f}  max {max_ms:.3f}".format(**stats))
    click.echo("throughput: {throughput_per_s:.1f} samples/s ({queries_per_s:.1f} queries/s)".format(**stats))
