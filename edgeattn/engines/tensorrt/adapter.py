"""The few places where TensorRT for RTX and full TensorRT (10.x / 11) differ, in one adapter.

Everything else (Builder, OnnxParser, optimization profiles, timing cache, IPluginV3) is the same Python
API in both `tensorrt_rtx` and `tensorrt`. Functions here take the imported module, so the worker
(`edgeattn.engines.tensorrt.worker`) builds with either.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from edgeattn.errors import BuildError
from edgeattn.optional import require


@dataclass(frozen=True)
class Flavor:
    """One TensorRT library: its Python module and what differs about it."""

    module: str  # "tensorrt_rtx" | "tensorrt"
    label: str
    distributions: tuple[str, ...]  # pip distribution names, to read the version without importing
    builds_without_gpu: bool  # TensorRT for RTX: CPU-only ahead-of-time builds
    sets_compute_capabilities: bool  # RTX: engines name the SMs they run on

    def load(self) -> ModuleType:
        return require(self.module, f"building {self.label} engines")

    def version(self) -> str | None:
        for dist in self.distributions:
            try:
                return importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                continue
        return None

    def available(self) -> bool:
        return importlib.util.find_spec(self.module) is not None


FLAVORS: dict[str, Flavor] = {
    "tensorrt_rtx": Flavor("tensorrt_rtx", "TensorRT for RTX", ("tensorrt-rtx", "tensorrt_rtx"), True, True),
    "tensorrt": Flavor("tensorrt", "TensorRT", ("tensorrt", "tensorrt-cu13", "tensorrt-cu12"), False, False),
}


def flavor(backend: str) -> Flavor:
    return FLAVORS[backend]


def cache_dir() -> Path:
    """Where timing caches and the library link live: $EDGEATTN_CACHE_DIR or ~/.cache/edgeattn."""
    root = os.environ.get("EDGEATTN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "edgeattn")
    return Path(root)


def subprocess_env(fl: Flavor) -> dict[str, str]:
    """Environment for a build subprocess. TensorRT for RTX resolves Python plugins through an unversioned
    `libtensorrt_rtx.so` that the wheel lacks: link it in the cache and put that folder on the library path."""
    env = dict(os.environ)
    if fl.module != "tensorrt_rtx":
        return env
    spec = importlib.util.find_spec("tensorrt_rtx_libs")
    if spec is None or not spec.submodule_search_locations:
        return env
    libdir = Path(list(spec.submodule_search_locations)[0])
    versioned = sorted(libdir.glob("libtensorrt_rtx.so.*"))
    if not versioned:
        raise BuildError(f"TensorRT for RTX: expected libtensorrt_rtx.so.* in {libdir}, found none")
    link_dir = library_link(versioned[0], fl.version())
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(link_dir), env.get("LD_LIBRARY_PATH")) if p)
    return env


def library_link(library: Path, version: str | None) -> Path:
    """A cache folder holding `libtensorrt_rtx.so` -> `library`, one per real path of the library.

    The cache is shared by every environment on the machine: keyed by version alone, a second environment
    would load the first one's library next to its own (two copies in one process corrupt the heap), and
    would break when the first one is deleted. A link that points anywhere else is replaced."""
    target = os.path.realpath(library)
    key = hashlib.sha256(target.encode()).hexdigest()[:16]
    link_dir = cache_dir() / "lib" / f"tensorrt_rtx-{version}-{key}"
    link_dir.mkdir(parents=True, exist_ok=True)
    link = link_dir / "libtensorrt_rtx.so"
    if os.path.realpath(link) != target:
        tmp = link_dir / f".libtensorrt_rtx.so.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target)
        os.replace(tmp, link)  # atomic: a concurrent build sees the old link or the new one
    return link_dir


def create_network(trt: ModuleType, builder):
    """A strongly typed network: precision comes from the graph (casts and Q/DQ), not builder flags."""
    flag = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    return builder.create_network(0 if flag is None else 1 << int(flag))


def configure_target(trt: ModuleType, config, fl: Flavor, sm: list[int], sparse: bool,
                     hardware_compat: str | None, version_compatible: bool) -> dict:
    """Compute capabilities (RTX), sparsity, hardware/version compatibility; returns what was set."""
    applied: dict = {}
    if fl.sets_compute_capabilities and sm:
        names = [f"SM{s}" for s in sm]
        missing = [n for n in names if not hasattr(trt.ComputeCapability, n)]
        if missing:
            raise BuildError(f"{fl.label} {fl.version()} cannot target {', '.join(missing)}: expected some of "
                             + ", ".join(n for n in dir(trt.ComputeCapability) if n.startswith("SM")))
        config.num_compute_capabilities = len(names)
        for i, name in enumerate(names):
            config.set_compute_capability(getattr(trt.ComputeCapability, name), i)
        applied["compute_capabilities"] = names
    if sparse:
        config.set_flag(trt.BuilderFlag.SPARSE_WEIGHTS)
        applied["sparse_weights"] = True
    if hardware_compat and not fl.sets_compute_capabilities:  # RTX expresses this through compute capabilities
        config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, hardware_compat)
        applied["hardware_compatibility"] = hardware_compat
    if version_compatible and hasattr(trt.BuilderFlag, "VERSION_COMPATIBLE"):
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
        applied["version_compatible"] = True
    return applied


def parser_flags(trt: ModuleType, parser) -> list[str]:
    """Let a registered plugin win over a same-named ONNX local function."""
    flag = getattr(trt.OnnxParserFlag, "ENABLE_PLUGIN_OVERRIDE", None)
    if flag is None:
        return []
    parser.set_flag(flag)
    return ["ENABLE_PLUGIN_OVERRIDE"]


def inspector_layers(trt: ModuleType, engine) -> list[dict]:
    """Per-layer information from the engine inspector (needs a deserialized engine, hence a GPU)."""
    import json

    inspector = engine.create_engine_inspector()
    info = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
    return [layer if isinstance(layer, dict) else {"Name": layer} for layer in info.get("Layers", [])]
