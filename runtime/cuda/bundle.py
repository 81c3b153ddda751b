"""Open a cuda bundle (edgeattn.bundle.cuda_build) on this machine's GPU as the engine's backend.

Each refusal is a clear error before anything is loaded: no PyTorch with CUDA or no GPU, a GPU older than
sm_80, a bundle whose ahead-of-time kernels are for other architectures, a model or a slot pool that does not
fit in the GPU's free memory (with how much is needed and how much is free).
"""

from __future__ import annotations

import json

from edgeattn.errors import BundleError, ConfigError, TargetError
from edgeattn.optional import require

MIN_SM = 80  # bf16 and the kernels' tensor-core paths
GEOMETRY_NAME = "decoder.json"  # edgeattn.bundle.cuda_build writes it
WEIGHTS_NAME = "weights.safetensors"


def is_cuda_bundle(bundle) -> bool:
    return bundle.manifest.backend == "cuda"


def device_check(bundle, device: str = "cuda"):
    """The torch device for a cuda bundle, or a TargetError saying what is missing."""
    torch = require("torch", "running a cuda bundle")
    if not torch.cuda.is_available():
        built = "with CUDA" if torch.version.cuda else "without CUDA (a CPU build)"
        raise TargetError(f"{bundle.path}: a cuda bundle needs an NVIDIA GPU and PyTorch with CUDA; found torch "
                          f"{torch.__version__} {built} and no usable GPU")
    dev = torch.device(device)
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


def memory_check(bundle, streams: int, device) -> None:
    torch = require("torch", "running a cuda bundle")
    d = bundle.manifest.sections["decoder"]
    free, _ = torch.cuda.mem_get_info(device)
    need = int(d["weights_bytes"]) + streams * int(d["cache_bytes_per_stream"])
    if need > free:
        fit = max((free - int(d["weights_bytes"])) // int(d["cache_bytes_per_stream"]), 0)
        raise ConfigError(f"{bundle.path}: {streams} slots need {need / 2**30:.2f} GiB (weights "
                          f"{int(d['weights_bytes']) / 2**30:.2f} GiB + {int(d['cache_bytes_per_stream']) / 2**20:.1f} "
                          f"MiB a slot), found {free / 2**30:.2f} GiB free on the GPU: at most {fit} slots fit")


def open_cuda_decoder(bundle, *, device: str = "cuda", window_max: int | None = None, compile: str = "linked"):
    """A CudaDecoder over the bundle's weights on the GPU (the bundle's files are hashed and confined)."""
    torch = require("torch", "running a cuda bundle")
    require("safetensors", "running a cuda bundle")
    from safetensors.torch import load_file

    from edgeattn.decoder.metadata import GENERATION_FILE, TOKENIZER_FILE
    from edgeattn.runtime.cuda.backend import CudaDecoder
    from edgeattn.runtime.cuda.decode_step import DecoderShape, PackedDecoder
    from edgeattn.runtime.generation.text import TextCodec

    if not is_cuda_bundle(bundle):
        raise BundleError(f"{bundle.path}: expected a cuda bundle, found backend {bundle.manifest.backend!r}")
    dev = device_check(bundle, device) if device != "cpu" else torch.device("cpu")
    geometry = json.loads(bundle.file(GEOMETRY_NAME).read_text(encoding="utf-8"))
    fields = {k: geometry[k] for k in DecoderShape.__dataclass_fields__}
    if window_max is not None:
        fields["window_max"] = int(window_max)
    shape = DecoderShape(**fields)
    tensors = load_file(str(bundle.file(bundle.manifest.artifact)), device=str(dev))
    weights = PackedDecoder.from_state_dict(shape, tensors, float(geometry.get("rope_scaling", 1.0)))
    generation = json.loads(bundle.file(GENERATION_FILE).read_text(encoding="utf-8"))
    codec = TextCodec.from_files(bundle.file(TOKENIZER_FILE), generation)
    check = (lambda streams: memory_check(bundle, streams, dev)) if dev.type == "cuda" else None
    return CudaDecoder(weights, codec, generation.get("eos_token_ids", []),
                       compile=compile if dev.type == "cuda" else "none",
                       info=bundle.manifest.sections.get("decoder"), memory_check=check)
