"""Ahead-of-time builds of the windowed-attention kernels: PTX + cubin + a JSON index, no GPU needed.

`compile_variant(variant, arch)` is the public entry point of the AOT `tensorrt.plugin`
(plugins/tensorrt/aot.py) and of other launchers (the TensorRT for RTX plugin, plugins/tensorrt/rtx.py,
runs the JIT torch op instead): it returns the PTX, the cubin and the launch metadata (kernel name,
threads, shared memory, the runtime parameter order, the grid rule). `compile_all(config)` writes every
variant for every arch plus `index.json`.

Kernel parameter order (TensorRT AOT convention): input pointers, scalars (int32; `sm_scale` is fp32 unless
a variant fixes `scale`), output pointers.
Triton >= 3.3 appends two hidden pointer parameters (global and profile scratch) after them; these
kernels use no scratch memory, so a launcher may pass null for both (see docs/kernels.md).
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from edgeattn import atomic
from edgeattn.errors import ConfigError
from edgeattn.optional import require
from edgeattn.plugins.kernels.tuning import DECODE_BLOCK_N, prefill_tile

ARCHS = {"sm_87": 87, "sm_90": 90, "sm_110": 110}
DTYPES = {"fp16": "*fp16", "bf16": "*bf16"}
KINDS = ("prefill", "decode_split", "decode_reduce", "ring_decode_split",  # ring: the cuda target's decode
         "ring_fp8_decode_split",  # the same over an FP8 E4M3 cache (ring_fp8.py): sm_89 and later
         "budget_select", "budget_decode_split", "page_bounds")  # the attention budget (budget_decode.py, budget_bounds.py)
FP8_KINDS = ("ring_fp8_decode_split",)
FP8_MIN_SM = 89  # FP8 conversions in hardware: Ada, Hopper, Thor; not Orin (sm_87)
FUSED_KINDS = ("fused_embed_qkv_rope", "fused_qkv_rope", "fused_linear_residual", "fused_gate_up", "fused_lm_head",
               "fused_argmax")  # the fused decode step's kernels (fused_decode.py), for one model's sizes
KINDS += FUSED_KINDS
# the fused variants built by default: SmolLM2-135M's sizes (kind, head dim, what each product reduces over)
FUSED_DEFAULTS = (("fused_embed_qkv_rope", 64, 576), ("fused_qkv_rope", 64, 576), ("fused_linear_residual", 64, 576),
                  ("fused_linear_residual", 64, 1536), ("fused_gate_up", 64, 576), ("fused_lm_head", 64, 576),
                  ("fused_argmax", 64, 49152))
DECODE_BLOCK_M = 16  # AOT decode variants serve GROUP * S_q <= 16 rows per kv head
DECODE_SPLITS = 16  # programs per kv head in the AOT decode grid (a power of two)
BUDGET_PAGE, BUDGET_K_MAX, BUDGET_PAGES = 16, 64, 512  # AOT budget variants: pages of 16 rows, k <= 64, rings <= 8,192


@dataclass(frozen=True)
class KernelVariant:
    """One compile-time specialisation of a kernel. `sinks` / `scale` None: left as runtime parameters."""

    kind: str
    dtype: str
    head_dim: int
    causal: bool = True
    has_pad: bool = False
    sinks: int | None = None
    scale: float | None = None
    features: int | None = None  # fused kinds: the size a product reduces over (a compile-time shape)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"kernel kind: expected one of {KINDS}, found {self.kind!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype: expected one of {sorted(DTYPES)}, found {self.dtype!r}")
        if self.head_dim not in (16, 32, 64, 128, 256):
            raise ConfigError(f"head_dim: expected 16, 32, 64, 128 or 256, found {self.head_dim}")
        if self.sinks is not None and self.sinks < 0:
            raise ConfigError(f"sinks: expected >= 0, found {self.sinks}")
        if (self.kind in FUSED_KINDS) != (self.features is not None and self.features > 0):
            raise ConfigError(f"features: expected a size > 0 for the fused kinds and none for the others, "
                              f"found {self.features} for {self.kind}")

    @property
    def name(self) -> str:
        parts = [self.kind, self.dtype, f"d{self.head_dim}"]
        if self.features is not None:
            parts.append(f"k{self.features}")
        elif self.kind != "decode_reduce":
            parts.append("causal" if self.causal else "bidir")
            if self.has_pad:
                parts.append("pad")
        if self.sinks is not None:
            parts.append(f"s{self.sinks}")
        if self.scale is not None:
            parts.append(f"scale{self.scale:g}")
        return "-".join(parts)


def default_variants() -> list[KernelVariant]:
    """What `edgeattn kernels compile` builds: fp16/bf16 x D 64/128, both masks, decode pair."""
    out = []
    for dtype in DTYPES:
        for d in (64, 128):
            out += [KernelVariant("prefill", dtype, d, causal=c) for c in (True, False)]
            out += [KernelVariant("decode_split", dtype, d), KernelVariant("decode_reduce", dtype, d)]
            out.append(KernelVariant("ring_decode_split", dtype, d))  # with decode_reduce: the cuda target's decode
            out.append(KernelVariant("ring_fp8_decode_split", dtype, d))  # the FP8 cache's (not for sm_87)
            out += [KernelVariant(kind, dtype, d) for kind in ("budget_select", "budget_decode_split", "page_bounds")]
        out += [KernelVariant(kind, dtype, d, features=k) for kind, d, k in FUSED_DEFAULTS]
    return out


@dataclass(frozen=True)
class CompileConfig:
    """Which archs and variants to build, and where. `only`: fnmatch patterns over variant names."""

    out_dir: Path
    archs: tuple[str, ...] = ("sm_87", "sm_90")
    only: tuple[str, ...] = ()
    ptx_version: int | None = None

    def __post_init__(self) -> None:
        bad = [a for a in self.archs if a not in ARCHS]
        if bad or not self.archs:
            raise ConfigError(f"--arch: expected a comma list of {', '.join(ARCHS)}, found {','.join(self.archs) or 'nothing'}")
        if self.ptx_version is not None and not 70 <= self.ptx_version <= 99:
            raise ConfigError(f"ptx_version: expected an ISA version like 85, found {self.ptx_version}")

    def variants(self) -> list[KernelVariant]:
        chosen = [v for v in default_variants() if not self.only or any(fnmatch.fnmatch(v.name, p) for p in self.only)]
        if not chosen:
            raise ConfigError(f"--only {','.join(self.only)}: expected to match some of {[v.name for v in default_variants()]}, matched none")
        return chosen


@dataclass
class CompiledKernel:
    """One compiled kernel: what a launcher needs besides the binary."""

    variant: str
    arch: str
    name: str
    num_warps: int
    shared: int
    constexprs: dict
    params: list[str]  # runtime parameters in order (hidden Triton scratch pointers not listed)
    grid: str
    ptx: str = field(repr=False)
    cubin: bytes = field(repr=False)

    def index_entry(self, ptx_file: str, cubin_file: str) -> dict:
        row = {k: v for k, v in asdict(self).items() if k not in ("ptx", "cubin")}
        row.update(ptx=ptx_file, cubin=cubin_file, threads=self.num_warps * 32,
                   ptx_target=_ptx_target(self.ptx))
        return row


def _ptx_target(ptx: str) -> str:
    found = re.search(r"^\.target\s+(\S+)", ptx, re.M)
    return found.group(1).rstrip(",") if found else ""


def _kernel_and_constexprs(variant: KernelVariant, arch: int):
    """(jit kernel, constexprs, num_warps, num_stages, grid rule) of one variant: the AOT contract."""
    from edgeattn.plugins.kernels import cached_decode, decode, prefill  # loads triton

    if variant.kind == "prefill":
        bm, bn, warps, stages = prefill_tile(arch, variant.head_dim)
        const = dict(CAUSAL=variant.causal, HAS_PAD=variant.has_pad, HEAD_DIM=variant.head_dim,
                     BLOCK_M=bm, BLOCK_N=bn, USE_TMA=False, ONE_LOOP=True)
        grid = f"(cdiv(S_q, {bm}), B * H, 1)"
        return prefill._windowed_fwd_kernel, const, warps, stages, grid
    if variant.kind == "decode_split":
        const = dict(CAUSAL=variant.causal, HAS_PAD=variant.has_pad, HEAD_DIM=variant.head_dim,
                     BLOCK_M=DECODE_BLOCK_M, BLOCK_N=DECODE_BLOCK_N, SPLITS=DECODE_SPLITS)
        return decode._windowed_decode_split_kernel, const, 4, 3, f"({DECODE_SPLITS}, B * H_kv, 1)"
    if variant.kind == "ring_decode_split":  # the sinks + ring cache's decode (cached_decode.py)
        const = dict(HEAD_DIM=variant.head_dim, BLOCK_M=DECODE_BLOCK_M, BLOCK_N=DECODE_BLOCK_N, SPLITS=DECODE_SPLITS)
        return cached_decode._cached_decode_split_kernel, const, 4, 2, f"({DECODE_SPLITS}, B * H_kv, 1)"
    if variant.kind == "ring_fp8_decode_split":  # FP8 K/V loads and per-head scales (ring_fp8.py)
        from edgeattn.plugins.kernels import ring_fp8

        block_n, warps, stages = ring_fp8.FP8_TILE
        const = dict(HEAD_DIM=variant.head_dim, BLOCK_M=DECODE_BLOCK_M, BLOCK_N=block_n, SPLITS=DECODE_SPLITS)
        return ring_fp8._ring_fp8_split_kernel, const, warps, stages, f"({DECODE_SPLITS}, B * H_kv, 1)"
    if variant.kind in ("budget_select", "budget_decode_split", "page_bounds"):
        return _budget_kernel(variant)
    if variant.kind in FUSED_KINDS:
        from edgeattn.plugins.kernels import fused_decode

        return fused_decode.aot_kernel(variant.kind, DTYPES[variant.dtype], variant.head_dim, variant.features)[:5]
    const = dict(HEAD_DIM=variant.head_dim, BLOCK_M=DECODE_BLOCK_M, SPLITS=DECODE_SPLITS)
    return decode._windowed_decode_reduce_kernel, const, 4, 1, "(B * H_kv, GROUP * S_q, 1)"


def _budget_kernel(variant: KernelVariant):
    """The attention budget's kernels: selection (one program per stream and kv head), the block-sparse split
    (then decode_reduce, as the ring decode), and the row + page bounds write (one program per stream and kv head)."""
    from edgeattn.plugins.kernels import budget_bounds, budget_decode

    d = variant.head_dim
    if variant.kind == "budget_select":
        const = dict(HEAD_DIM=d, PAGE=BUDGET_PAGE, BLOCK_M=DECODE_BLOCK_M, BLOCK_P=128, P_POW2=BUDGET_PAGES,
                     K_TOP=BUDGET_K_MAX, K_MAX=BUDGET_K_MAX, HAS_TOPK=budget_decode.HAS_TOPK)
        return budget_decode._budget_select_kernel, const, 4, 1, "(B * H_kv, 1, 1)"
    if variant.kind == "budget_decode_split":
        const = dict(HEAD_DIM=d, BLOCK_M=DECODE_BLOCK_M, BLOCK_N=DECODE_BLOCK_N, PAGE=BUDGET_PAGE,
                     K_MAX=BUDGET_K_MAX, SPLITS=DECODE_SPLITS)
        return budget_decode._budget_decode_split_kernel, const, 4, 2, f"({DECODE_SPLITS}, B * H_kv, 1)"
    const = dict(HEAD_DIM=d, PAGE=BUDGET_PAGE, WRITE=True)
    return budget_bounds._page_bounds_kernel, const, 1, 1, "(1, B * H_kv, 1)"


def _fused_types(variant: KernelVariant) -> dict:
    """A fused kernel's parameter types (its pointers are not named as the attention kernels'); {} for the others."""
    if variant.kind not in FUSED_KINDS:
        return {}
    from edgeattn.plugins.kernels import fused_decode

    return fused_decode.aot_kernel(variant.kind, DTYPES[variant.dtype], variant.head_dim, variant.features)[5]


def _arch_number(arch: str | int) -> int:
    """`"sm_87"` / `"sm_90a"` / `90` -> 87 / 90 / 90."""
    if isinstance(arch, int):
        return arch
    found = re.fullmatch(r"sm_(\d+)a?", arch)
    if not found:
        raise ConfigError(f"arch: expected a name like sm_87 or a number like 90, found {arch!r}")
    return int(found.group(1))


def compile_variant(variant: KernelVariant, arch: str | int, *, ptx_version: int | None = None) -> CompiledKernel:
    """Compile one variant for one arch (`"sm_87"`, `90`, ...) with no GPU: PTX, cubin and metadata."""
    triton = require("triton", "ahead-of-time kernel builds")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    arch_num = _arch_number(arch)
    if variant.kind in FP8_KINDS and arch_num < FP8_MIN_SM:  # Triton: "type fp8e4nv not supported" on sm_87
        raise ConfigError(f"{variant.name}: FP8 E4M3 loads need sm_{FP8_MIN_SM} or later, found sm_{arch_num}")
    fn, const, warps, stages, grid = _kernel_and_constexprs(variant, arch_num)
    if not variant.has_pad and "Mask" in fn.arg_names:
        const.update(Mask=None, stride_mb=0)  # no padding input: the pointer disappears from the signature
    if variant.sinks is not None and "sinks" in fn.arg_names:
        const["sinks"] = variant.sinks
    if variant.scale is not None and "sm_scale" in fn.arg_names:
        const["sm_scale"] = variant.scale
    if "USE_PDL" in fn.arg_names:  # ahead of time: plain launches (the AOT launcher sets no launch attributes)
        const.setdefault("USE_PDL", False)
    if "LAST_MERGES" in fn.arg_names:  # the reduce kernel merges the splits ahead of time
        const.setdefault("LAST_MERGES", False)
        const.setdefault("Counter", None)
    signature, params = {}, []
    fused = _fused_types(variant)
    for name in fn.arg_names:
        if name in const:
            signature[name] = "constexpr"
            continue
        if name in fused:
            signature[name] = fused[name]
        elif name in ("K", "V") and variant.kind in FP8_KINDS:
            signature[name] = "*fp8e4nv"
        elif name in ("KS", "VS"):
            signature[name] = "*fp32"
        elif name in ("Q", "QS", "K", "V", "Out", "KN", "VN", "Bounds", "SK", "SV"):  # SK, SV: FP8 cache sinks
            signature[name] = DTYPES[variant.dtype]
        elif name in ("Window", "Pos", "Pages"):
            signature[name] = "*i64"
        elif name == "Sel":
            signature[name] = "*i32"
        elif name == "Mask":
            signature[name] = "*i8"
        elif name.startswith("Part"):
            signature[name] = "*fp32"
        elif name == "sm_scale":
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
        params.append(name)
    options = {"num_warps": warps, "num_stages": stages}
    if ptx_version is not None:
        options["ptx_version"] = ptx_version
    kernel = triton.compile(ASTSource(fn, signature, const), target=GPUTarget("cuda", arch_num, 32), options=options)
    arch_name = arch if isinstance(arch, str) else f"sm_{arch_num}"
    return CompiledKernel(variant=variant.name, arch=arch_name, name=kernel.metadata.name,
                          num_warps=kernel.metadata.num_warps, shared=kernel.metadata.shared,
                          constexprs={k: v for k, v in const.items()}, params=params, grid=grid,
                          ptx=kernel.asm["ptx"], cubin=bytes(kernel.asm["cubin"]))


def _cdiv(x, m: int):
    return (x + (m - 1)) // m


def prefill_launch(kernel: CompiledKernel, q_shape, k_shape) -> tuple[tuple, list]:
    """Grid and int32 scalar arguments (in `kernel.params` order) of a contiguous prefill launch.

    Shapes may hold ints or symbolic expressions (TensorRT `shape_expr` entries): only +, *, // are used.
    q_shape: [B, H, S_q, D]; k_shape: [B, H_kv, S_k, D]. Pointers (Q, K, V, Window, Out) are not included:
    the launcher passes them in the order of `kernel.params`.
    """
    if not kernel.variant.startswith("prefill"):
        raise ConfigError(f"prefill_launch: expected a prefill kernel, found {kernel.variant}")
    b, h, s_q, d = q_shape
    _, h_kv, s_k, _ = k_shape
    q_strides = (h * s_q * d, s_q * d, d)
    k_strides = (h_kv * s_k * d, s_k * d, d)
    values = dict(zip(("stride_qb", "stride_qh", "stride_qm"), q_strides))
    values.update(zip(("stride_kb", "stride_kh", "stride_kn"), k_strides))
    values.update(zip(("stride_vb", "stride_vh", "stride_vn"), k_strides))
    values.update(zip(("stride_ob", "stride_oh", "stride_om"), q_strides))
    values.update(H=h, GROUP=h // h_kv, S_q=s_q, S_k=s_k)
    scalars = [values[name] for name in kernel.params if name in values]
    missing = [n for n in kernel.params if n not in values and n not in ("Q", "K", "V", "Window", "Out")]
    if missing:
        raise ConfigError(f"prefill_launch: parameters {missing} have no value; compile with sinks and scale fixed")
    grid = (_cdiv(s_q, kernel.constexprs["BLOCK_M"]), b * h, 1)
    return grid, scalars


def compile_all(config: CompileConfig) -> dict:
    """Write `<variant>.<arch>.ptx` / `.cubin` for every variant and arch, and `index.json`; returns the index."""
    import triton

    rows = []
    with atomic.directory(Path(config.out_dir)) as stage:
        for arch in config.archs:
            for variant in config.variants():
                if variant.kind in FP8_KINDS and _arch_number(arch) < FP8_MIN_SM:
                    continue  # no FP8 on this arch (Orin): its bundles take the bf16 cache
                kernel = compile_variant(variant, arch, ptx_version=config.ptx_version)
                stem = f"{variant.name}.{arch}"
                (stage / f"{stem}.ptx").write_text(kernel.ptx)
                (stage / f"{stem}.cubin").write_bytes(kernel.cubin)
                rows.append(kernel.index_entry(f"{stem}.ptx", f"{stem}.cubin"))
        index = {"format": "edgeattn-kernels/1", "triton": triton.__version__, "archs": list(config.archs),
                 "kernels": rows}
        (stage / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    return index


__all__ = ["ARCHS", "CompileConfig", "CompiledKernel", "KernelVariant", "compile_all", "compile_variant",
           "default_variants", "prefill_launch"]
