"""Target profiles as data: what each device can run and which toolchain builds for it."""

from __future__ import annotations

from dataclasses import dataclass

from edgeattn.errors import TargetError
from edgeattn.gpu import detect_gpu  # resolve_target looks it up here, so tests can replace it


@dataclass(frozen=True)
class Target:
    """One deployment target."""

    name: str
    description: str
    backend: str  # "onnxruntime" | "tensorrt_rtx" | "tensorrt"
    sm: tuple[int, ...]  # compute capabilities, e.g. (87,); empty for CPU
    precisions: tuple[str, ...]  # fp32, fp16, bf16, int8, int4 (weight-only), fp8, fp4
    sparse_tensor_cores: bool  # 2:4 structured sparsity speeds up GEMMs
    attention_plugin: bool  # edgeattn::WindowedAttention maps to a plugin, not the portable body
    min_trt: str | None  # minimum TensorRT (or TensorRT for RTX) version
    builds_on_host: bool  # an engine can be built on an x86 host without the device

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
        Target("cpu", "ONNX Runtime on the CPU (the embedded default)", "onnxruntime", (),
               ("fp32", "int8", "int4"), False, False, None, True),
        Target("rtx", "TensorRT for RTX, GeForce/RTX Turing..Blackwell (SM75-SM121)", "tensorrt_rtx",
               (75, 80, 86, 89, 120, 121), ("fp32", "fp16", "bf16", "int8", "int4", "fp8"), False, True,
               "1.0", True),
        Target("orin-nano", "Jetson Orin Nano (sm_87), JetPack 6+", "tensorrt", (87,),
               ("fp32", "fp16", "bf16", "int8", "int4"), True, True, "10.3", False),
        Target("orin-agx", "Jetson AGX Orin (sm_87), JetPack 6+", "tensorrt", (87,),
               ("fp32", "fp16", "bf16", "int8", "int4"), True, True, "10.3", False),
        Target("thor", "Jetson Thor (sm_110), JetPack 7+", "tensorrt", (110,),
               ("fp32", "fp16", "bf16", "int8", "int4", "fp8", "fp4"), True, True, "10.13", False),
        Target("h100", "H100 / H200 data-center GPU (sm_90)", "tensorrt", (90,),
               ("fp32", "fp16", "bf16", "int8", "int4", "fp8"), True, True, "10.0", True),
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
    if gpu is not None and available("tensorrt"):
        lowered = gpu.lower()
        if "orin" in lowered:
            return TARGETS["orin-agx"], f"auto: found {gpu} and TensorRT"
        if "thor" in lowered:
            return TARGETS["thor"], f"auto: found {gpu} and TensorRT"
        return TARGETS["h100"], f"auto: found {gpu} and TensorRT"
    if gpu is not None and available("tensorrt_rtx"):
        return TARGETS["rtx"], f"auto: found {gpu} and TensorRT for RTX"
    why = "no NVIDIA GPU" if gpu is None else f"{gpu} but no TensorRT"
    return TARGETS["cpu"], f"auto: {why}, so ONNX Runtime on the CPU"
