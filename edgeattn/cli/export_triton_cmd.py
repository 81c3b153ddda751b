"""edgeattn export-triton."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("export-triton")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--repo", type=click.Path(path_type=Path), required=True, help="Model repository folder (created).")
@click.option("--name", help="Model name in the repository [default: the bundle's model name].")
@click.option("--version", "version", default=1, show_default=True, help="Model version folder.")
@click.option("--max-batch", type=int, help="max_batch_size [default: the bundle's batch maximum; 0: off].")
@click.option("--no-dynamic-batching", is_flag=True, help="Leave dynamic batching off.")
@click.option("--queue-delay-us", default=100, show_default=True, help="Dynamic batching: max queue delay.")
@click.option("--preferred-batch", type=int, multiple=True, help="Dynamic batching: a preferred batch size.")
@click.option("--instances", default=1, show_default=True, help="Model instances (GPU models: on each GPU).")
@click.option("--gpus", help="GPU models (tensorrt, rtx and cuda bundles): the GPUs their instances run on, a comma "
              "list such as 0,1 [default: every GPU the server sees].")
@click.option("--plugin-library", type=click.Path(path_type=Path),
              help="TensorRT plugin .so the server loads (tensorrt bundles).")
@click.option("--cpu-backend", type=click.Choice(["onnxruntime", "python"]), default="onnxruntime", show_default=True,
              help="cpu bundles: Triton's onnxruntime backend, or the Python backend running the bundle through "
                   "edgeattn (for servers without an onnxruntime backend, such as the nvidia-pytriton wheel's).")
@click.option("--python-path", type=click.Path(path_type=Path), multiple=True,
              help="Python-backend models: a folder the server's Python adds in front of sys.path, first given "
                   "first (a folder with numpy<2, then the site-packages holding edgeattn). Repeatable.")
@click.option("--window", type=click.IntRange(min=0), default=0, show_default=True,
              help="Attention window (0: full attention) of requests that give none (Python backend: requests may "
                   "send attention_window), or of every request (onnxruntime backend: fixed in model.onnx).")
def export_triton(bundle, repo, name, version, max_batch, no_dynamic_batching, queue_delay_us, preferred_batch,
                  instances, gpus, plugin_library, cpu_backend, python_path, window):
    """Write a Triton Inference Server model repository for BUNDLE (config.pbtxt, the engine, launch.sh).

    Decoder bundles become a decoupled Python-backend model that streams text (Triton's generate_stream); a cuda
    bundle's instances run on GPUs (KIND_GPU), each opening the bundle on its own GPU."""
    from edgeattn.tritonserver.repository import TritonConfig, export_triton as run

    cfg = TritonConfig(model_name=name, version=version, max_batch_size=max_batch,
                       dynamic_batching=not no_dynamic_batching, max_queue_delay_us=queue_delay_us,
                       preferred_batch_sizes=tuple(preferred_batch), instances=instances,
                       plugin_library=plugin_library, cpu_backend=cpu_backend,
                       python_path=tuple(str(p) for p in python_path), window=window, gpus=_gpus(gpus))
    folder = run(bundle, repo, cfg)
    click.echo(f"model {folder} (serve with {Path(repo) / 'launch.sh'})")


def _gpus(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        return tuple(int(g) for g in text.split(","))
    except ValueError:
        raise click.BadParameter(f"expected GPU indices such as 0,1, found {text!r}", param_hint="--gpus") from None
