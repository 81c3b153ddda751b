"""Target profiles as data: what each device can run and which toolchain builds for it."""

from __future__ import annotations

from dataclasses import dataclass

from edgeattn.errors import TargetError
from edgeattn.gpu import detect_gpu  # resolve_target looks it up here, so tests can replace it


@dataclass(frozen=True, kw_only=True)
class Target:
    """One deployment target. Code asks a target what it can do; it never tests a target's name."""

    name: str
    description: str
    backend: str  # "onnxruntime" | "tensorrt_rtx" | "tensorrt" | "cuda" (PyTorch + Triton kernels, decoders)
    sm: tuple[int, ...] = ()  # compute capabilities, e.g. (87,); empty for CPU
    precisions: tuple[str, ...]  # fp32, fp16, bf16, int8, int4 (weight-only), fp8, fp4
    sparse_tensor_cores: bool = False  # 2:4 structured sparsity speeds up GEMMs
    attention_plugin: bool = False  # edgeattn::WindowedAttention maps to a plugin, not the portable body
    min_trt: str | None = None  # minimum TensorRT (or TensorRT for RTX) version
    builds_on_host: bool = True  # an engine can be built on an x86 host without the device
    hardware_compat: str | None = None  # TensorRT hardware-compatibility level for engines of this target
    gpu_names: tuple[str, ...] = ()  # lower-case parts of an nvidia-smi name that identify the device (auto)
    auto_fallback: bool = False  # `auto` picks this target for a GPU no other TensorRT target names

    def supports(self, precision: str) -> bool:
        return precision in self.precisions

    def require_precision(self, precision: str) -> None:
        if not self.supports(precision):
            raise TargetError(
                f"target {self.name!r} has no {precision} support: expected one of {', '.join(self.precisions)}"
            )

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "backend": self.backend,
            "sm": list(self.sm),
            "precisions": list(self.precisions),
            "sparse_tensor_cores": self.sparse_tensor_cores,
            "attention_plugin": self.attention_plugin,
            "min_trt": self.min_trt,
        }


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(name="cpu", description="ONNX Runtime on the CPU (the embedded default)", backend="onnxruntime",
               precisions=("fp32", "int8", "int4")),
        Target(name="rtx", description="TensorRT for RTX, GeForce/RTX Turing..Blackwell (SM75-SM121)",
               backend="tensorrt_rtx", sm=(75, 80, 86, 89, 120, 121),
               precisions=("fp32", "fp16", "bf16", "int8", "int4", "fp8"), attention_plugin=True, min_trt="1.0"),
        Target(name="orin-nano", description="Jetson Orin Nano (sm_87), JetPack 6+", backend="tensorrt", sm=(87,),
               precisions=("fp32", "fp16", "bf16", "int8", "int4"), sparse_tensor_cores=True,
               attention_plugin=True, min_trt="10.3", builds_on_host=False, gpu_names=("orin nano",)),
        Target(name="orin-agx", description="Jetson AGX Orin (sm_87), JetPack 6+", backend="tensorrt", sm=(87,),
               precisions=("fp32", "fp16", "bf16", "int8", "int4"), sparse_tensor_cores=True,
               attention_plugin=True, min_trt="10.3", builds_on_host=False, gpu_names=("orin",)),
        Target(name="thor", description="Jetson Thor (sm_110), JetPack 7+", backend="tensorrt", sm=(110,),
               precisions=("fp32", "fp16", "bf16", "int8", "int4", "fp8", "fp4"), sparse_tensor_cores=True,
               attention_plugin=True, min_trt="10.13", builds_on_host=False, gpu_names=("thor",)),
        Target(name="cuda", description="PyTorch + edgeattn's Triton kernels on any NVIDIA GPU from sm_80 "
               "(decoders: Orin sm_87, H100/H200 sm_90, Thor sm_110)", backend="cuda",
               sm=(80, 86, 87, 89, 90, 100, 110, 120), precisions=("fp32", "fp16", "bf16")),
        Target(name="h100", description="H100 / H200 data-center GPU (sm_90)", backend="tensorrt", sm=(90,),
               precisions=("fp32", "fp16", "bf16", "int8", "int4", "fp8"), sparse_tensor_cores=True,
               attention_plugin=True, min_trt="10.0", hardware_compat="SAME_COMPUTE_CAPABILITY",
               gpu_names=("h100", "h200"), auto_fallback=True),
    )
}


def get_target(name: str) -> Target:
    """Look a target up by name; `auto` is resolved by `resolve_target`, not here."""
    try:
        return TARGETS[name]
    except KeyError:
        raise TargetError(f"unknown target {name!r}: expected auto or one of {', '.join(TARGETS)}") from None


def resolve_target(name: str) -> tuple[Target, str]:
    """Resolve a target name, `auto` included; returns the target and why it was chosen."""
    if name != "auto":
        return get_target(name), f"asked for {name}"
    from edgeattn.optional import available

    gpu = detect_gpu()
    for backend, library in (("tensorrt", "TensorRT"), ("tensorrt_rtx", "TensorRT for RTX")):
        if gpu is None or not available(backend):
            continue
        candidates = [t for t in TARGETS.values() if t.backend == backend]
        lowered = gpu.lower()
        named = [t for t in candidates if any(part in lowered for part in t.gpu_names)]
        named.sort(key=lambda t: -max(len(part) for part in t.gpu_names if part in lowered))  # most specific
        chosen = named[:1] or [t for t in candidates if t.auto_fallback or len(candidates) == 1][:1]
        if chosen:
            return chosen[0], f"auto: found {gpu} and {library}"
    why = "no NVIDIA GPU" if gpu is None else f"{gpu} but no TensorRT"
    cpu = next(t for t in TARGETS.values() if t.backend == "onnxruntime")
    return cpu, f"auto: {why}, so ONNX Runtime on the CPU"
