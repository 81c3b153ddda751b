"""edgeattn serve."""

from __future__ import annotations

import importlib
from pathlib import Path

import click


def _controller_factory(spec: str):
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise click.BadParameter(f"expected MODULE:FACTORY, found {spec!r}", param_hint="--controller")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise click.BadParameter(f"cannot load {spec!r}: {exc}", param_hint="--controller") from None


class _Slots(click.ParamType):
    """A number of slots, or `auto` (held as 0)."""

    name = "N|auto"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        if str(value).strip().lower() == "auto":
            return 0
        try:
            slots = int(value)
        except ValueError:
            self.fail(f"expected a number of slots or 'auto', found {value!r}", param, ctx)
        if slots < 1:
            self.fail(f"expected at least 1 slot (or 'auto'), found {slots}", param, ctx)
        return slots


def _thermal_source(bundles, sensor: str) -> tuple[str, int]:
    """The sensor and NVML GPU index for the controller: the GPU the first cuda bundle opens on, if any."""
    from edgeattn.runtime.cuda.bundle import is_cuda_bundle, thermal_source

    cuda = [b for b in bundles if is_cuda_bundle(b)]
    return thermal_source(cuda[0], sensor) if cuda else (sensor, 0)


def _gpu_controllers(bundles, gpus, policy, sensor: str, initial: int, bound: int, max_window: int):
    """serve --devices with a thermal policy: a window per GPU (`initial`, at most `bound`), each moved by a
    controller reading that GPU's sensor (NVML: its index there)."""
    from edgeattn.runtime.cuda.bundle import thermal_source
    from edgeattn.runtime.live_window import LiveWindow
    from edgeattn.runtime.thermal.service import ControllerGroup, thermal_controller

    windows, controllers = [], []
    for index in gpus:
        window = LiveWindow(initial, max_window=bound)
        kind, nvml = thermal_source(bundles[0], sensor, device=f"cuda:{index}")
        windows.append(window)
        controllers.append(thermal_controller(window, policy=policy, sensor=kind, max_window=max_window, gpu=nvml))
    return windows, ControllerGroup(controllers)


def _check_budget_policy(app, controller) -> None:
    """A thermal policy that splits its levels into retrieval pages needs every served model to read pages:
    refused at start-up rather than failing requests once the device heats."""
    from edgeattn.attention.budget import AttentionBudget
    from edgeattn.errors import ConfigError
    from edgeattn.runtime.generation.engine import live_budget
    from edgeattn.runtime.server.app import DECODERS, MODELS

    split = getattr(controller, "split", None)
    if split is None or split.window_only:
        return
    policy = f"--thermal-policy: a budget policy (recent {split.recent:g})"
    if app[MODELS]:
        raise ConfigError(f"{policy} needs models that read retrieval pages, found bundles that read a window only: "
                          f"{', '.join(sorted(app[MODELS]))}")
    for name, decoder in app[DECODERS].items():
        try:
            live_budget(decoder.model, AttentionBudget(split.page, 1, split.page))
        except ConfigError as exc:
            raise ConfigError(f"{policy} cannot run on {name!r}: {exc}") from None


def _budget_line(decoder, controller) -> str:
    """The live attention budget of a decoder at start-up, and what moves it."""
    from edgeattn.runtime.generation.engine import budget_rows

    live, layout = decoder.scheduler.engine.live(), decoder.layout
    window = f"window {live.window}" if live.window else f"the whole ring of {layout.window_max}"
    pages = f" + {live.pages} pages of {live.page}" if live.pages else ""
    split = getattr(getattr(controller, "split", None), "recent", 1.0)
    mover = "" if controller is None else (f"; the thermal policy moves it (recent share {split:g})"
                                           if split < 1.0 else "; the thermal policy moves the window")
    return (f"attention budget of {decoder.name}: {budget_rows(layout, live)} rows ({layout.sinks} sinks + "
            f"{window}{pages}){mover}; a request's attention_budget caps it")


@click.command()
@click.argument("bundles", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--host", default=None, help="Address to listen on [default: 127.0.0.1].")
@click.option("--port", type=int, default=None, help="Port [default: 8000].")
@click.option("--name", help="Model name when one bundle is served [default: the manifest's name].")
@click.option("--max-batch", type=int, help="Rows per batch, capped by the bundle's range; 1 turns batching off "
              "[default: 8].")
@click.option("--max-queue-delay-ms", type=float, help="How long a batch waits to fill [default: 2].")
@click.option("--max-queue", type=int, help="Queued requests per model before refusals (KServe routes: 503; "
              "generation routes: 429) [default: 256].")
@click.option("--threads", type=int, help="ONNX Runtime intra-op threads [default: its own].")
@click.option("--window", type=int, help="Initial attention window, 0 = full [default: 0].")
@click.option("--controller", "controller_spec", metavar="MODULE:FACTORY",
              help="Thermal controller: FACTORY(window=LiveWindow) returns an object with start()/stop() "
                   "(and optionally metrics_snapshot()).")
@click.option("--thermal-policy", type=click.Path(path_type=Path, dir_okay=False),
              help="Run the thermal controller with this policy file (TOML or YAML; see `edgeattn thermal tune`).")
@click.option("--thermal-sensor", default="auto", show_default=True,
              help="Sensor for the thermal controller: auto, sysfs, nvml or replay:TRACE.csv (auto beside a cuda "
                   "bundle: NVML for its GPU, or sysfs zones on a Jetson).")
@click.option("--max-window", type=int, help="Window the policy's levels are fractions of "
              "[default: the largest sequence length the bundles accept].")
@click.option("--admin-token", default=None, metavar="TOKEN",
              help="Require 'Authorization: Bearer TOKEN' on the admin routes (/v2/admin/*) "
                   "[default: EDGEATTN_SERVE_ADMIN_TOKEN, else none: see docs/serving.md before binding 0.0.0.0].")
@click.option("--slots", type=_Slots(), help="Decoder bundles: requests generating at once, batched at every "
              "decode step (one KV-cache row each), or 'auto': cuda bundles as many as fit in the GPU's memory left "
              "after the weights and a reserve (at most 256), other decoder bundles 8 [default: auto].")
@click.option("--prefill-chunk", type=int, help="Decoder bundles: prompt tokens per prefill step, interleaved "
              "with the decode steps of the other requests [default: 16 on a CPU, 2048 on a GPU].")
@click.option("--prefill-in-step", type=int, help="Decoder bundles: prompts of at most this many tokens are "
              "prefilled inside the decode steps, one token per step, instead of in chunks of their own "
              "(no latency spike for the other streams; a longer time to first token) [default: 0].")
@click.option("--prompt-attention", type=click.Choice(["budget", "whole"]), help="Decoder bundles: what a prompt "
              "reads, the live window or budget as generated tokens do, or every cached row (whole: the budget "
              "bounds generated tokens only) [default: budget].")
@click.option("--shutdown-timeout", type=float, help="Seconds queued requests get to finish after SIGTERM "
              "[default: 30].")
@click.option("--devices", metavar="all|0,1,...", help="cuda bundles: one engine per GPU (its own weights, slots "
              "and CUDA graphs) behind one model name; a request goes to the GPU with the most free slots "
              "[default: one GPU, the current one].")
def serve(bundles, host, port, name, max_batch, max_queue_delay_ms, max_queue, threads, window, controller_spec,
          thermal_policy, thermal_sensor, max_window, admin_token, slots, prefill_chunk, prefill_in_step,
          prompt_attention, shutdown_timeout, devices):
    """Serve BUNDLES over KServe v2 / Triton HTTP (binary tensors, dynamic batching, /metrics).

    Decoder bundles are served through the OpenAI-compatible routes (/v1/completions,
    /v1/chat/completions, streamed as server-sent events) and Triton's generate extension, with continuous
    batching over --slots slots.

    Settings not given as options are read from EDGEATTN_SERVE_<NAME> variables (e.g.
    EDGEATTN_SERVE_MAX_BATCH). Ctrl-C or SIGTERM stops taking requests (503), finishes the queued ones
    within the shutdown timeout, then exits; a second signal answers the rest 503 at once. A model that
    fails to load ends the process with the reason (exit code 6).
    """
    from edgeattn.optional import require

    require("aiohttp", "the inference server")
    require("prometheus_client", "the inference server's metrics")
    from edgeattn.bundle.folder import open_bundle
    from edgeattn.runtime.live_window import LiveWindow
    from edgeattn.runtime.server.app import DECODERS, NO_WINDOW_LIMIT, create_app
    from edgeattn.runtime.server.runner import serve_forever
    from edgeattn.runtime.server.decoder_runtime import window_bound
    from edgeattn.runtime.server.settings import ServeSettings

    if max_window is not None and max_window < 1:  # 0 used to fall back to the default without a word
        raise click.BadParameter(f"expected a window of at least 1 token, found {max_window}",
                                 param_hint="--max-window")
    if name and len(bundles) != 1:
        raise click.BadParameter(f"--name names one bundle, found {len(bundles)} bundles", param_hint="--name")
    settings = ServeSettings.from_env(host=host, port=port, max_batch=max_batch,
                                      max_queue_delay_ms=max_queue_delay_ms, max_queue=max_queue,
                                      threads=threads, window=window, admin_token=admin_token,
                                      shutdown_timeout_s=shutdown_timeout, slots=slots,
                                      prefill_chunk=prefill_chunk, prefill_in_step=prefill_in_step,
                                      prompt_attention=prompt_attention, devices=devices)
    opened = [open_bundle(b) for b in bundles]
    gpus = None
    if settings.devices:
        from edgeattn.runtime.cuda.devices import keep_multicast_off, resolve_devices

        keep_multicast_off()  # before anything starts NCCL or NVSHMEM in this process
        gpus = resolve_devices(opened, settings.devices)
    longest = max(window_bound(b) for b in opened)
    bound = max(longest, max_window or 0) or NO_WINDOW_LIMIT
    if settings.window > bound:
        raise click.BadParameter(f"expected 0..{bound} (0 = full attention, {bound} = the longest sequence the "
                                 f"bundles accept), found {settings.window}", param_hint="--window")
    live = LiveWindow(settings.window, max_window=bound)
    if controller_spec and thermal_policy:
        raise click.BadParameter("give --controller or --thermal-policy, not both", param_hint="--controller")
    controller = _controller_factory(controller_spec)(window=live) if controller_spec else None
    device_windows = None
    if thermal_policy:
        from edgeattn.runtime.thermal.service import thermal_controller

        if not (max_window or longest):
            raise click.BadParameter("the bundles have no sequence range: give --max-window", param_hint="--max-window")
        if gpus is None:
            sensor, gpu = _thermal_source(opened, thermal_sensor)
            controller = thermal_controller(live, policy=thermal_policy, sensor=sensor,
                                            max_window=max_window or longest, gpu=gpu)
        else:
            device_windows, controller = _gpu_controllers(opened, gpus, thermal_policy, thermal_sensor,
                                                          settings.window, bound, max_window or longest)
    app = create_app(opened, settings, names=[name] if name else None, window=live, controller=controller,
                     devices=gpus, device_windows=device_windows)
    models = ", ".join(f"{n} ({b.manifest.backend})" for n, b in
                       zip([name] if name else [b.manifest.name for b in opened], opened))
    click.echo(f"serving {models} on http://{settings.host}:{settings.port} (max batch {settings.max_batch}, "
               f"queue delay {settings.max_queue_delay_ms:g} ms)", err=True)
    for decoder in app[DECODERS].values():
        for line in decoder.describe().splitlines():  # one line per GPU
            click.echo(f"generation slots of {line}", err=True)
    _check_budget_policy(app, controller)
    for decoder in app[DECODERS].values():
        click.echo(_budget_line(decoder, controller), err=True)
    serve_forever(app, settings.host, settings.port, shutdown_timeout=settings.shutdown_timeout_s,
                  print_fn=lambda msg: click.echo(msg, err=True))
