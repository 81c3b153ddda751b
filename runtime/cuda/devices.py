"""The GPUs a served cuda bundle runs on (`edgeattn serve BUNDLE --devices all|0,1,...`), and the environment of
processes that use several GPUs.

`resolve_devices` checks the list against the machine before anything loads: GPUs there at all, every index in
range, no index twice, every bundle a cuda bundle built for every GPU's architecture. `engine_device` is the torch
device an engine opens on (tests give CPU tensors in its place); `open_engine_decoder` opens it there, its calls
pinned to that GPU.
"""

from __future__ import annotations

import os

from edgeattn.errors import ConfigError, TargetError
from edgeattn.optional import require
from edgeattn.runtime.cuda.bundle import device_check, is_cuda_bundle, open_cuda_decoder

ALL = "all"
# NVLink multicast (NVLS) off in NCCL, PyTorch's symmetric memory and NVSHMEM: on shared multi-GPU hosts a
# program that uses it can put every GPU of the host out of service
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def keep_multicast_off(environ=None) -> None:
    """Set NO_MULTICAST's variables where they are not set already (a value given by the user is kept)."""
    environ = os.environ if environ is None else environ
    for name, value in NO_MULTICAST.items():
        environ.setdefault(name, value)


def parse_devices(spec: str) -> tuple[int, ...] | None:
    """`all` (None) or GPU indices `0,1,...`, each once; "" is refused (the caller means one GPU, as by default)."""
    text = spec.strip().lower()
    if text == ALL:
        return None
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts):
        raise ConfigError(f"devices: expected 'all' or GPU indices such as 0,1, found {spec!r}")
    indices = tuple(int(p) for p in parts)
    twice = sorted({i for i in indices if indices.count(i) > 1})
    if twice:
        raise ConfigError(f"devices: expected each GPU once, found {', '.join(map(str, twice))} more than once in "
                          f"{spec!r}")
    return indices


def resolve_devices(bundles, spec: str) -> tuple[int, ...]:
    """The GPU indices `spec` names on this machine, checked against it and against every bundle."""
    torch = require("torch", "serving a cuda bundle on several GPUs")
    wanted = parse_devices(spec)
    for bundle in bundles:
        if not is_cuda_bundle(bundle):
            raise ConfigError(f"--devices: expected cuda bundles (one engine per GPU), found {bundle.path} with "
                              f"backend {bundle.manifest.backend!r}")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        built = "with CUDA" if torch.version.cuda else "without CUDA (a CPU build)"
        raise TargetError(f"--devices {spec}: expected NVIDIA GPUs and PyTorch with CUDA, found torch "
                          f"{torch.__version__} {built} and no usable GPU")
    indices = tuple(range(count)) if wanted is None else wanted
    beyond = [i for i in indices if i >= count]
    if beyond:
        raise ConfigError(f"--devices: expected GPU indices 0..{count - 1} ({count} GPUs here), found {beyond[0]}")
    gpus = {i: (torch.cuda.get_device_name(i), _sm(torch, i)) for i in indices}
    for bundle in bundles:
        _check_architectures(bundle, gpus)
        for i in indices:
            device_check(bundle, f"cuda:{i}")  # sm_80 or later
    return indices


def engine_device(index: int) -> str:
    """The torch device of GPU `index`'s engine."""
    return f"cuda:{index}"


def open_engine_decoder(bundle, index: int, *, window_max: int | None = None):
    """The cuda decoder of GPU `index`'s engine, opened with that GPU current, every later call too (OnDevice)."""
    torch = require("torch", "serving a cuda bundle on several GPUs")
    device = torch.device(engine_device(index))
    if device.type != "cuda":  # CPU tensors in tests: nothing to pin
        return open_cuda_decoder(bundle, device=str(device), window_max=window_max)
    with torch.cuda.device(device):
        return OnDevice(open_cuda_decoder(bundle, device=str(device), window_max=window_max), device)


class OnDevice:
    """A decoder whose every method runs with its GPU as the calling thread's current device.

    The current device is per thread and starts at GPU 0: Triton launches on the current device's stream, and a
    CUDA graph captures on it, so an engine on GPU 1 stepped by its scheduler's thread (or warmed up on a pool
    thread) must make GPU 1 current around each call. Attributes that are not methods pass through."""

    def __init__(self, model, device) -> None:
        torch = require("torch", "serving a cuda bundle on several GPUs")
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_current", lambda: torch.cuda.device(device))  # a context: `device` current

    def __getattr__(self, name: str):
        value = getattr(self._model, name)
        if not callable(value):
            return value
        current = self._current

        def pinned(*args, **kwargs):
            with current():
                return value(*args, **kwargs)

        return pinned

    def __setattr__(self, name: str, value) -> None:
        setattr(self._model, name, value)


def device_label(index: int) -> str:
    """The GPU's name in metrics, statistics and the start-up log."""
    return f"cuda:{index}"


def _sm(torch, index: int) -> int:
    major, minor = torch.cuda.get_device_capability(index)
    return 10 * major + minor


def _check_architectures(bundle, gpus: dict[int, tuple[str, int]]) -> None:
    """GPUs of several architectures need a bundle built for each (its ahead-of-time kernels are per sm)."""
    archs = {sm for _, sm in gpus.values()}
    built_for = {int(a) for a in bundle.manifest.target.get("sm", [])}
    if len(archs) < 2 or not built_for or archs <= built_for:
        return
    found = ", ".join(f"cuda:{i} {name} (sm_{sm})" for i, (name, sm) in sorted(gpus.items()))
    wanted = ",".join(f"sm_{a}" for a in sorted(archs))
    raise TargetError(f"{bundle.path}: built for {', '.join(f'sm_{a}' for a in sorted(built_for))}, found GPUs of "
                      f"several architectures: {found}; rebuild with --arch {wanted} or list GPUs of one kind "
                      f"in --devices")
