"""Open a cuda bundle (edgeattn.bundle.cuda_build) on this machine's GPU as the engine's backend.

Each refusal is a clear error before anything is loaded: no PyTorch with CUDA or no GPU, a GPU older than
sm_80, a bundle whose ahead-of-time kernels are for other architectures, a model that does not fit in the GPU's
free memory, and later a slot pool that does not fit in what the weights left (memory.py: the sizes needed and
found). A bundle built in bf16 runs in fp16 on a GPU without bf16 (the choice is logged, and recorded in the
decoder's `info["precision"]`).
"""

from __future__ import annotations

import json
import logging
import os

from edgeattn.errors import BundleError, TargetError
from edgeattn.optional import require
from edgeattn.runtime.cuda.memory import (ACTIVATION_BYTES_PER_VOCAB_ENTRY, SlotPlan, check_weights_fit,
                                          plan_slots)

MIN_SM = 80  # bf16 and the kernels' tensor-core paths
GEOMETRY_NAME = "decoder.json"  # edgeattn.bundle.cuda_build writes it
WEIGHTS_NAME = "weights.safetensors"
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}

log = logging.getLogger(__name__)


def is_cuda_bundle(bundle) -> bool:
    return bundle.manifest.backend == "cuda"


def device_check(bundle, device: str = "cuda"):
    """The torch device for a cuda bundle (with its index), or a TargetError saying what is missing."""
    torch = require("torch", "running a cuda bundle")
    if not torch.cuda.is_available():
        built = "with CUDA" if torch.version.cuda else "without CUDA (a CPU build)"
        raise TargetError(f"{bundle.path}: a cuda bundle needs an NVIDIA GPU and PyTorch with CUDA; found torch "
                          f"{torch.__version__} {built} and no usable GPU")
    dev = torch.device(device)
    if dev.index is None:
        dev = torch.device(dev.type, torch.cuda.current_device())
    major, minor = torch.cuda.get_device_capability(dev)
    sm = 10 * major + minor
    name = torch.cuda.get_device_name(dev)
    if sm < MIN_SM:
        raise TargetError(f"{bundle.path}: expected a GPU of sm_{MIN_SM} or later, found {name} (sm_{sm})")
    built_for = [int(a) for a in bundle.manifest.target.get("sm", [])]
    if built_for and sm not in built_for:
        raise TargetError(f"{bundle.path}: built for {', '.join(f'sm_{a}' for a in built_for)}, found {name} (sm_{sm});"
                          f" rebuild with --arch sm_{sm}")
    return dev


def runtime_precision(built: str, bf16_supported: bool) -> tuple[str, str]:
    """(the precision a bundle built in `built` runs in, why): bf16 becomes fp16 on a GPU without bf16."""
    if built == "bf16" and not bf16_supported:
        return "fp16", "bf16 is not supported on this GPU: running in fp16"
    return built, f"{built}, as built"


def nvml_index(device) -> int:
    """NVML's index of a CUDA device (NVML counts GPUs in PCI order; CUDA may not, and CUDA_VISIBLE_DEVICES
    renumbers them): matched by UUID when NVML can say, else the CUDA_VISIBLE_DEVICES entry, else CUDA's index."""
    torch = require("torch", "running a cuda bundle")
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        import pynvml

        uuid = str(torch.cuda.get_device_properties(index).uuid)
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
            return int(pynvml.nvmlDeviceGetIndex(handle))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no pynvml, no driver, or a torch without uuid: fall back on the numbering
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        if index < len(visible) and visible[index].isdigit():
            return int(visible[index])
        return index


def thermal_source(bundle, sensor: str = "auto", device: str = "cuda") -> tuple[str, int]:
    """(sensor, NVML index) for a thermal controller beside a cuda bundle on its GPU: `auto` is Jetson's sysfs
    zones on an integrated GPU (Orin, Thor: the GPU is on the module) and NVML on a discrete one (a server's
    sysfs zones are its CPUs'); NVML reads the GPU the bundle opens on (`device`). Other sensors are left as given."""
    torch = require("torch", "running a cuda bundle")
    if sensor not in ("auto", "nvml"):
        return sensor, 0
    dev = device_check(bundle, device)  # no GPU: the error opening the bundle gives
    if sensor == "auto":
        sensor = "sysfs" if getattr(torch.cuda.get_device_properties(dev), "is_integrated", False) else "nvml"
    return sensor, nvml_index(dev) if sensor == "nvml" else 0


def _cast(torch, tensors: dict, dtype) -> dict:
    """bf16 tensors as `dtype`; a TargetError if a weight does not fit its range (fp16's largest is 65504)."""
    out = {k: v.to(dtype) if v.dtype == torch.bfloat16 else v for k, v in tensors.items()}
    bad = [k for k, v in out.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise TargetError(f"weights {', '.join(bad[:4])}: expected values within {dtype}'s range, found some beyond "
                          f"it: rebuild with --precision fp32 or run on a GPU with bf16")
    return out


def open_cuda_decoder(bundle, *, device: str = "cuda", window_max: int | None = None, compile: str = "auto",
                      mem_get_info=None, bf16: bool | None = None, kv_cache: str | None = None):
    """A CudaDecoder over the bundle's weights on the GPU (the bundle's files are hashed and confined).

    `mem_get_info`: () -> (free, total) bytes, the GPU's by default (tests give a figure on CPU tensors); with one,
    the weights are checked against it before they load, the slot pool is sized from it (`slot_plan`) and every
    cache is checked before it is allocated. `bf16`: whether the device runs bf16 (the GPU's answer by default).
    `kv_cache="fp8"`: an FP8 KV cache (runtime/cuda/fp8_build.py; calibrated now if the bundle has no scales).
    FP8 weights or an FP8 cache on a GPU without FP8 (sm < 89: Orin, Ampere) are refused, naming the GPU."""
    torch = require("torch", "running a cuda bundle")
    require("safetensors", "running a cuda bundle")
    from safetensors.torch import load_file

    from edgeattn.decoder.metadata import GENERATION_FILE, TOKENIZER_FILE
    from edgeattn.runtime.cuda.backend import CudaDecoder
    from edgeattn.runtime.cuda.decode_step import DecoderShape, PackedDecoder
    from edgeattn.runtime.generation.text import TextCodec

    if not is_cuda_bundle(bundle):
        raise BundleError(f"{bundle.path}: expected a cuda bundle, found backend {bundle.manifest.backend!r}")
    fp8_wanted = kv_cache == "fp8" or "fp8" in (bundle.manifest.precision.get("float"),
                                                bundle.manifest.precision.get("kv_cache"))
    if fp8_wanted and device != "cpu" and torch.cuda.is_available():  # before the arch check: no rebuild helps
        from edgeattn.runtime.cuda.fp8 import check_fp8_gpu

        major, minor = torch.cuda.get_device_capability(torch.device(device))
        check_fp8_gpu(torch.cuda.get_device_name(torch.device(device)), 10 * major + minor, str(bundle.path))
    dev = device_check(bundle, device) if device != "cpu" else torch.device("cpu")
    on_gpu = dev.type == "cuda"
    read = mem_get_info or ((lambda: torch.cuda.mem_get_info(dev)) if on_gpu else None)
    where = f"{torch.cuda.get_device_name(dev)} ({dev})" if on_gpu else str(dev)
    section = dict(bundle.manifest.sections["decoder"])
    if read is not None:
        free, total = read()
        check_weights_fit(bundle.path, int(section["weights_bytes"]), int(free), int(total), where)
    built = str(bundle.manifest.precision.get("float", "bf16"))
    supported = bf16 if bf16 is not None else (torch.cuda.is_bf16_supported() if on_gpu else True)
    precision, why = runtime_precision(built, supported)
    if precision != built:
        log.warning("%s: %s", bundle.path, why)
    geometry = json.loads(bundle.file(GEOMETRY_NAME).read_text(encoding="utf-8"))
    fields = {k: geometry[k] for k in DecoderShape.__dataclass_fields__}
    if window_max is not None:
        fields["window_max"] = int(window_max)
    shape = DecoderShape(**fields)
    tensors = load_file(str(bundle.file(bundle.manifest.artifact)), device=str(dev))
    if precision != built:
        tensors = _cast(torch, tensors, getattr(torch, DTYPES[precision]))
    generation = json.loads(bundle.file(GENERATION_FILE).read_text(encoding="utf-8"))
    codec = TextCodec.from_files(bundle.file(TOKENIZER_FILE), generation)
    rope = float(geometry.get("rope_scaling", 1.0))
    if fp8_wanted:  # FP8 weights as the decode step's tuples; the FP8 cache's scales
        from edgeattn.runtime.cuda.fp8_build import open_fp8

        tensors = open_fp8(tensors, bundle.manifest.precision, kv_cache=kv_cache, encode=codec.encode,
                           build=lambda t: PackedDecoder.from_state_dict(shape, t, rope))
    weights = PackedDecoder.from_state_dict(shape, tensors, rope)
    info = {**section, "precision": precision, "precision_note": why, "device": str(dev), "device_name": where}
    check = None
    if read is not None:
        figures = dict(weights=int(section["weights_bytes"]), cache_bytes_per_slot=weights.cache_bytes_per_stream(),
                       activation_bytes_per_slot=ACTIVATION_BYTES_PER_VOCAB_ENTRY * shape.vocab)
        free, total = read()  # what the weights left
        info["memory"] = {"free": int(free), "total": int(total), **figures}

        def check(streams: int) -> None:
            now_free, now_total = read()
            plan_slots(bundle.path, free=int(now_free), total=int(now_total), requested=streams, **figures)

    return CudaDecoder(weights, codec, generation.get("eos_token_ids", []),
                       compile=compile if on_gpu else "none", info=info, memory_check=check)


def slot_plan(decoder, requested: int | None = None, where="the model") -> SlotPlan | None:
    """The slot pool of an opened cuda decoder: `requested` slots, or as many as fit (None); None when the
    decoder was opened without a memory figure (CPU tensors)."""
    memory = decoder.info.get("memory")
    if not memory:
        return None
    return plan_slots(where, requested=requested, **memory)
