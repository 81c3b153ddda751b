"""`edgeattn export-triton`: a bundle -> a Triton Inference Server model repository.

What serves each kind of bundle:
- tensorrt (orin / thor / h100): platform `tensorrt_plan`, the engine as `model.plan`; a plugin library
  (the ahead-of-time attention plugin) is loaded by the server: `--backend-config=tensorrt,plugins=...`
  (written to `launch.sh`, and recorded in the config's parameters). An engine with the attention window
  input (a scalar, which Triton cannot feed) is served by the Python backend instead, as rtx bundles are.
- tensorrt_rtx (rtx): Triton's TensorRT backend links full TensorRT and cannot load TensorRT for RTX
  engines, and the rtx attention plugin is Python; so the model uses Triton's Python backend, whose
  `model.py` runs the bundle through `edgeattn.runtime` (the bundle is copied beside it).
- onnxruntime (cpu): platform `onnxruntime_onnx` with the optimized model (the attention op's ONNX
  function body runs in ONNX Runtime); or, with `cpu_backend="python"` (`--cpu-backend python`), the Python
  backend running the bundle through `edgeattn.runtime.backends`, for servers without an onnxruntime backend
  (the `tritonserver` that the nvidia-pytriton wheel ships has none).
- decoder bundles (any target): a decoupled Python-backend model that streams text through
  `edgeattn.runtime.generation` (`decoder_config.py`, `python_decoder_model.py`). A cuda bundle's model has
  KIND_GPU instances (one per GPU by default; `gpus` picks the GPUs), each opening the bundle on its own GPU.
Python-backend models get `edgeattn_environment.py` beside `model.py` and, with `python_path`, the folders
that the server's Python must add to sys.path (`python_environment.py` says why and in which order).
Dynamic batching is on when every input and output but the attention window leads with the batch dimension.
The window (a scalar in the graph; Triton has no scalar tensors) is, for Python-backend models, the optional
input of the same name with one value per row (`dims: [ 1 ]`), defaulting to `--window` (parameter
`edgeattn_window`), and a batch runs each window apart (`window_batches.py`); for `onnxruntime_onnx` models it
is fixed at `--window` in model.onnx (`fixed_window.py` says why). The config says which in a comment.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from edgeattn import atomic
from edgeattn.bundle.folder import Bundle, open_bundle
from edgeattn.errors import BundleError, ConfigError, InputError
from edgeattn.bundle.manifest import check_model_name
from edgeattn.tritonserver.decoder_config import render_decoder_config
from edgeattn.tritonserver.fixed_window import write_fixed_window
from edgeattn.tritonserver.python_environment import PARAMETER as PYTHON_PATH_PARAMETER
from edgeattn.tritonserver.window_batches import WINDOW_PARAMETER

TRITON_TYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "bfloat16": "TYPE_BF16", "float64": "TYPE_FP64",
                "int64": "TYPE_INT64", "int32": "TYPE_INT32", "int8": "TYPE_INT8", "uint8": "TYPE_UINT8",
                "bool": "TYPE_BOOL"}

CPU_BACKENDS = ("onnxruntime", "python")
CONFIG_MARK = "# edgeattn export-triton:"
LAUNCH_MARK = "(written by edgeattn export-triton)"


@dataclass(frozen=True)
class TritonConfig:
    """How to lay out the model repository. Validated on construction."""

    model_name: str | None = None  # default: the bundle's model name
    version: int = 1
    max_batch_size: int | None = None  # None: the bundle's batch maximum; 0: no batching
    dynamic_batching: bool = True
    max_queue_delay_us: int = 100
    preferred_batch_sizes: tuple[int, ...] = ()
    instances: int = 1
    plugin_library: Path | None = None  # a TensorRT plugin .so for tensorrt bundles
    cpu_backend: str = "onnxruntime"  # cpu bundles: Triton's "onnxruntime" backend or the "python" backend
    python_path: tuple[str, ...] = ()  # Python-backend models: folders put in front of the server's sys.path
    window: int = 0  # attention window of requests that give none (Python backend), or fixed (onnxruntime_onnx)
    gpus: tuple[int, ...] = ()  # GPU instances: the GPUs they run on (none: every GPU the server sees)

    def __post_init__(self) -> None:
        if any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in self.gpus) or \
                len(set(self.gpus)) != len(self.gpus):
            raise ConfigError(f"gpus: expected distinct GPU indices >= 0, found {list(self.gpus)}")
        if self.window < 0:
            raise ConfigError(f"window: expected >= 0 (0 = full attention), found {self.window}")
        if self.cpu_backend not in CPU_BACKENDS:
            raise ConfigError(f"cpu_backend: expected one of {', '.join(CPU_BACKENDS)}, found {self.cpu_backend!r}")
        for folder in self.python_path:
            if not str(folder) or any(c in str(folder) for c in ('"', "\n", os.pathsep)):
                raise ConfigError(f"python_path: expected folder names without quotes, newlines or "
                                  f"{os.pathsep!r}, found {str(folder)!r}")
        if self.version < 1:
            raise ConfigError(f"version: expected >= 1, found {self.version}")
        if self.max_batch_size is not None and self.max_batch_size < 0:
            raise ConfigError(f"max_batch_size: expected >= 0, found {self.max_batch_size}")
        if self.instances < 1 or self.max_queue_delay_us < 0:
            raise ConfigError(f"instances >= 1 and max_queue_delay_us >= 0 expected, found {self.instances} "
                              f"and {self.max_queue_delay_us}")
        if self.model_name is not None:
            try:
                check_model_name(self.model_name, "model_name")
            except BundleError as exc:
                raise ConfigError(str(exc)) from None


def _scalar_window(m):
    """The bundle's attention window input when it is a scalar (or one value), else None."""
    spec = m.input("window")
    return spec if spec is not None and all(d == 1 for d in spec.dims) else None


def _batching(bundle: Bundle, cfg: TritonConfig) -> tuple[int, str]:
    """(max_batch_size, why) from the manifest: the batch dim must lead every input and output but the window."""
    m = bundle.manifest
    kinds = m.sections.get("dimension_kinds", {})
    if cfg.max_batch_size == 0:
        return 0, "batching turned off (--max-batch 0)"
    window = _scalar_window(m)
    for spec in [s for s in m.inputs if s is not window] + m.outputs:
        if not spec.dims or kinds.get(str(spec.dims[0])) != "batch":
            return 0, f"no batching: {spec.name} does not lead with the batch dimension (dims {list(spec.dims) or 'scalar'})"
    batch_dim = str(m.inputs[0].dims[0])
    limit = m.shape_ranges[batch_dim][2]
    if cfg.max_batch_size is not None and cfg.max_batch_size > limit:
        raise InputError(f"--max-batch {cfg.max_batch_size} is above the bundle's batch range (max {limit})")
    return cfg.max_batch_size or limit, f"batch dimension {batch_dim!r}, range {m.shape_ranges[batch_dim]}"


def _tensor(spec, batched: bool) -> list[str]:
    dims = [d if isinstance(d, int) else -1 for d in (spec.dims[1:] if batched else spec.dims)]
    return [f'    name: "{spec.name}"', f"    data_type: {TRITON_TYPES[spec.dtype]}",
            f"    dims: [ {', '.join(map(str, dims))} ]"]


def _window_tensor(spec) -> list[str]:
    """The window of a Python-backend model: optional, one value per row, whatever the batching."""
    return [f'    name: "{spec.name}"', f"    data_type: {TRITON_TYPES[spec.dtype]}", "    dims: [ 1 ]",
            "    optional: true"]


def _window_comment(window, kind: str, cfg: TritonConfig) -> str | None:
    if window is None:
        return None
    if kind == "onnxruntime_onnx":
        return (f"# attention window: fixed at {cfg.window} in model.onnx (0 = full attention; Triton has no scalar "
                f"inputs: per-request windows need --cpu-backend python)")
    return (f"# attention window: optional input {window.name!r}, one value per row (default {cfg.window}, "
            f"0 = full attention); a batch runs each window apart")


def model_kind(bundle: Bundle, cfg: TritonConfig) -> str:
    """What serves the bundle: "tensorrt_plan", "onnxruntime_onnx", "python" or "python_decoder"."""
    m = bundle.manifest
    if m.sections.get("decoder"):
        return "python_decoder"
    if m.backend == "tensorrt":  # Triton cannot feed an engine's scalar window: the Python backend does
        return "tensorrt_plan" if _scalar_window(m) is None else "python"
    if m.backend == "onnxruntime" and cfg.cpu_backend == "onnxruntime":
        return "onnxruntime_onnx"
    return "python"


def _python_path_lines(cfg: TritonConfig) -> list[str]:
    if not cfg.python_path:
        return []
    value = os.pathsep.join(str(Path(p).absolute()) for p in cfg.python_path)
    return ["parameters {", f'  key: "{PYTHON_PATH_PARAMETER}"', f'  value: {{ string_value: "{value}" }}', "}"]


def render_config(bundle: Bundle, cfg: TritonConfig, name: str) -> str:
    """config.pbtxt text (protobuf text format of inference.ModelConfig)."""
    m = bundle.manifest
    kind = model_kind(bundle, cfg)
    instance_kind = "KIND_CPU" if m.backend == "onnxruntime" else "KIND_GPU"
    header = f"{CONFIG_MARK} {m.name} for target {m.target['name']} ({m.backend})"
    if kind == "python_decoder":
        lines = [header, *render_decoder_config(m, name, cfg.instances, instance_kind, cfg.gpus)]
        lines += [f'version_policy: {{ specific: {{ versions: [ {cfg.version} ] }} }}', *_python_path_lines(cfg)]
        return "\n".join(lines) + "\n"
    max_batch, why = _batching(bundle, cfg)
    window = _scalar_window(m)
    lines = [header, f"# batching: {why}", *filter(None, [_window_comment(window, kind, cfg)]), f'name: "{name}"']
    lines.append(f'platform: "{kind}"' if kind != "python" else 'backend: "python"')
    lines.append(f"max_batch_size: {max_batch}")
    for spec in m.inputs:
        if spec is not window:
            lines += ["input {", *_tensor(spec, max_batch > 0), "}"]
        elif kind == "python":
            lines += ["input {", *_window_tensor(spec), "}"]
    for spec in m.outputs:
        lines += ["output {", *_tensor(spec, max_batch > 0), "}"]
    if max_batch > 0 and cfg.dynamic_batching:
        lines.append("dynamic_batching {")
        preferred = [b for b in cfg.preferred_batch_sizes if b <= max_batch]
        if preferred:
            lines.append(f"  preferred_batch_size: [ {', '.join(map(str, preferred))} ]")
        lines += [f"  max_queue_delay_microseconds: {cfg.max_queue_delay_us}", "}"]
    lines += ["instance_group {", f"  count: {cfg.instances}", f"  kind: {instance_kind}"]
    if cfg.gpus:
        lines.append(f"  gpus: [ {', '.join(map(str, cfg.gpus))} ]")
    profiles = len(m.sections.get("engine", {}).get("profiles", []))
    if m.backend == "tensorrt" and profiles > 1:  # let every instance use all of the engine's profiles
        names = ", ".join(f'"{i}"' for i in range(profiles))
        lines.append(f"  profile: [ {names} ]")
    lines.append("}")
    lines += [f'version_policy: {{ specific: {{ versions: [ {cfg.version} ] }} }}']
    if cfg.plugin_library is not None:
        lines += ["parameters {", '  key: "edgeattn_plugin_library"',
                  f'  value: {{ string_value: "plugins/{Path(cfg.plugin_library).name}" }}', "}"]
    if window is not None and kind == "python":
        lines += ["parameters {", f'  key: "{WINDOW_PARAMETER}"', f'  value: {{ string_value: "{cfg.window}" }}', "}"]
    lines += _python_path_lines(cfg)
    return "\n".join(lines) + "\n"


def _ours(path: Path, mark: str, first_lines: int = 2) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            return any(mark in f.readline() for _ in range(first_lines))
    except (OSError, UnicodeDecodeError):
        return False


def _is_exported_model(folder: Path) -> bool:
    """An earlier export-triton model folder (its config.pbtxt starts with our mark)."""
    return folder.is_dir() and not folder.is_symlink() and _ours(folder / "config.pbtxt", CONFIG_MARK, 1)


def _launch_script(name: str, cfg: TritonConfig, backend: str, kind: str) -> str:
    lines = ["#!/usr/bin/env bash", f"# Serve {name} {LAUNCH_MARK}.",
             "# TRITONSERVER: the server binary (default: tritonserver on PATH); extra arguments are passed on",
             'cd "$(dirname "$0")"']
    server = '"${TRITONSERVER:-tritonserver}" --model-repository="$PWD"'
    if cfg.plugin_library is not None:
        lib = f"$PWD/{name}/plugins/{Path(cfg.plugin_library).name}"
        lines.append("# the TensorRT backend loads the attention plugin library before deserializing the engine")
        lines.append(f'exec {server} --backend-config=tensorrt,plugins="{lib}" "$@"')
    else:
        if backend == "tensorrt_rtx":
            lines.append("# Python backend: the server's Python needs edgeattn[rtx] and torch (the attention plugin)")
        if kind.startswith("python"):
            lines.append("# Python backend: the server's Python needs edgeattn and numpy < 2 "
                         "(export with --python-path; docs/serving.md)")
        lines.append(f'exec {server} "$@"')
    return "\n".join(lines) + "\n"


def _write_python_model(bundle: Bundle, version_dir: Path, decoder: bool) -> None:
    """The bundle, model.py and the sys.path bootstrap it imports first."""
    here = Path(__file__).parent
    shutil.copytree(bundle.path, version_dir / "bundle")
    shutil.copy2(here / ("python_decoder_model.py" if decoder else "python_model.py"), version_dir / "model.py")
    shutil.copy2(here / "python_environment.py", version_dir / "edgeattn_environment.py")


def export_triton(bundle_path: str | Path, repo: str | Path, cfg: TritonConfig = TritonConfig()) -> Path:
    """Write REPO/<name>/ (config.pbtxt, <version>/<model file>) and REPO/launch.sh; returns the model folder."""
    bundle = open_bundle(bundle_path)
    m = bundle.manifest
    if cfg.plugin_library is not None:
        if m.backend != "tensorrt":
            raise InputError(f"--plugin-library is for tensorrt bundles (a C++ plugin for Triton's TensorRT "
                             f"backend), found a {m.backend} bundle")
        if not Path(cfg.plugin_library).is_file():
            raise InputError(f"plugin library not found: {cfg.plugin_library}")
    kind = model_kind(bundle, cfg)
    if cfg.plugin_library is not None and kind != "tensorrt_plan":
        raise InputError(f"--plugin-library is for Triton's TensorRT backend; this bundle's engine takes the "
                         f"attention window as a scalar input {_scalar_window(m).name!r}, which Triton cannot "
                         f"feed, so it is served by the Python backend (leave --plugin-library out)")
    if cfg.python_path and not kind.startswith("python"):
        raise InputError(f"--python-path is for Python-backend models (rtx, decoder, or cpu with --cpu-backend "
                         f"python), found a {m.backend} bundle served by {kind}")
    if cfg.gpus and m.backend == "onnxruntime":
        raise InputError(f"--gpus is for models whose instances run on GPUs, found a {m.backend} bundle, whose "
                         f"instances run on the CPU (KIND_CPU)")
    name = check_model_name(cfg.model_name or m.name, "model name")  # never a path: it is a folder in REPO
    repo = Path(repo)
    launch = repo / "launch.sh"
    if launch.is_symlink() or (launch.exists() and not _ours(launch, LAUNCH_MARK)):
        raise InputError(f"{launch} exists and was not written by edgeattn export-triton: refusing to replace it; "
                         f"choose another --repo or remove it yourself")
    with atomic.directory(repo / name, owned=_is_exported_model,
                          what="model folder written by edgeattn export-triton") as staging:
        (staging / "config.pbtxt").write_text(render_config(bundle, cfg, name), encoding="utf-8")
        version_dir = staging / str(cfg.version)
        version_dir.mkdir()
        if kind == "tensorrt_plan":
            shutil.copy2(bundle.artifact, version_dir / "model.plan")
        elif kind == "onnxruntime_onnx" and _scalar_window(m) is not None:
            write_fixed_window(bundle.artifact, version_dir / "model.onnx", _scalar_window(m).name, cfg.window)
        elif kind == "onnxruntime_onnx":
            shutil.copy2(bundle.artifact, version_dir / "model.onnx")
        else:
            _write_python_model(bundle, version_dir, decoder=kind == "python_decoder")
        if cfg.plugin_library is not None:
            (staging / "plugins").mkdir()
            shutil.copy2(cfg.plugin_library, staging / "plugins" / Path(cfg.plugin_library).name)
    atomic.write_text(launch, _launch_script(name, cfg, m.backend, kind))
    launch.chmod(0o755)
    return repo / name
