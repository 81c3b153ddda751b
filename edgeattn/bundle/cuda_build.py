"""`edgeattn build MODEL --target cuda`: a Hugging Face decoder (a folder or a packaged model such as `smollm2`)
-> a bundle for PyTorch + the project's Triton kernels on an NVIDIA GPU (sm_80 and later; Orin sm_87,
H100/H200 sm_90, Thor sm_110).

The bundle holds the weights in the layout the decode step reads (`weights.safetensors`: Q/K/V and gate/up
packed), `decoder.json` (the geometry), the tokenizer and generation settings, the ahead-of-time kernels of the
target architectures (`kernels/`, PTX + cubin + index.json, compiled without a GPU), `report.md` and the
manifest with every file hashed. Nothing is written unless every step succeeds.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from edgeattn import __version__, atomic
from edgeattn.bundle.folder import Bundle, is_bundle, open_bundle
from edgeattn.bundle.manifest import MANIFEST_NAME, REPORT_NAME, Manifest, check_model_name
from edgeattn.decoder.metadata import GENERATION_FILE, TOKENIZER_FILE
from edgeattn.errors import BundleError, ConfigError
from edgeattn.optional import require

WEIGHTS_NAME = "weights.safetensors"
GEOMETRY_NAME = "decoder.json"
KERNELS_DIR = "kernels"
CUDA_PRECISIONS = ("bf16", "fp16", "fp32")
CUDA_ARCHS = ("sm_87", "sm_90", "sm_110")  # Orin, H100/H200, Thor: compiled ahead of time by default
FP8_PRECISIONS = ("fp8",)  # FP8 weights (runtime/cuda/fp8.py): the float parts stay bf16
FP8_ARCHS = ("sm_90", "sm_110")  # the default archs of an FP8 build (Orin has no FP8)
FP8_MIN_SM = 89


@dataclass(frozen=True)
class CudaBuildConfig:
    out: Path
    precision: str = "bf16"
    sinks: int = 4
    window_max: int = 2048
    archs: tuple[str, ...] = CUDA_ARCHS  # () = no ahead-of-time kernels (they compile at first use)
    name: str | None = None
    kv_cache: str | None = None  # "fp8": the FP8 KV cache (runtime/cuda/fp8_cache.py); None: the float type
    fp8_rounding: str = "gptq"  # FP8 weights: "gptq" (error feedback, runtime/cuda/fp8_gptq.py) or "nearest"
    calibration: Path | None = None  # FP8 weights' calibration text (one document a line); None: lee_background

    def __post_init__(self) -> None:
        if self.precision not in CUDA_PRECISIONS + FP8_PRECISIONS:
            raise ConfigError(f"precision: the cuda target takes {', '.join(CUDA_PRECISIONS + FP8_PRECISIONS)}, "
                              f"found {self.precision!r}")
        if self.sinks < 0 or self.window_max < 1:
            raise ConfigError(f"expected sinks >= 0 and window_max >= 1, found {self.sinks} and {self.window_max}")
        bad = [a for a in self.archs if a not in ("sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_100", "sm_110",
                                                   "sm_120")]
        if bad:
            raise ConfigError(f"archs: expected names like sm_87, sm_90, sm_110, found {', '.join(bad)}")
        if self.kv_cache not in (None, "fp8"):
            raise ConfigError(f"kv_cache: expected fp8 or none (the float type), found {self.kv_cache!r}")
        if self.fp8_rounding not in ("gptq", "nearest"):
            raise ConfigError(f"fp8_rounding: expected gptq or nearest, found {self.fp8_rounding!r}")
        if self.calibration is not None and not Path(self.calibration).is_file():
            raise ConfigError(f"calibration: expected a text file (one document a line), found no file at "
                              f"{self.calibration}")
        no_fp8 = [a for a in self.archs if int(a.removeprefix("sm_")) < FP8_MIN_SM]
        if no_fp8 and "fp8" in (self.precision, self.kv_cache):
            raise ConfigError(f"--precision / --kv-cache fp8: FP8 needs sm_{FP8_MIN_SM} or later (Ada, Hopper, Thor), "
                              f"found {', '.join(no_fp8)} in --arch (Orin sm_87 and Ampere have no FP8): build for "
                              f"sm_90,sm_110, and a bf16 bundle for those")
        if self.name is not None:
            try:
                check_model_name(self.name, "name")
            except BundleError as exc:
                raise ConfigError(str(exc)) from None


def _dtype(torch, precision: str):
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8": torch.bfloat16}[precision]


def _dtype_name(tensor) -> str:
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(str(tensor.dtype).removeprefix("torch."),
                                                                       str(tensor.dtype).removeprefix("torch."))


def layer_precision(tensors: dict, precision: str) -> dict:
    """The manifest's per-layer precision: every stored matrix and vector by name (`wqkv.3`: layer 3's packed
    Q/K/V projection) with its dtype, then what runs at that precision without being stored (attention, the
    KV cache). The LM head, when tied, is the embedding."""
    layers = {name: _dtype_name(t) for name, t in tensors.items()}
    if "lm_head" not in layers:
        layers["lm_head"] = f"{layers['embed']} (tied to embed)"
    return {**layers, "attention": precision, "kv_cache": precision}


def build_cuda(model: str | Path, config: CudaBuildConfig, *, progress=lambda msg: None) -> Bundle:
    torch = require("torch", "building for the cuda target")
    transformers = require("transformers", "building for the cuda target")
    from edgeattn import hf_models
    from edgeattn.plugins.kernels.aot import CompileConfig, compile_all
    from edgeattn.runtime.cuda.decode_step import PackedDecoder

    folder = hf_models.resolve(model)
    progress(f"load {folder}")
    hf, tokenizer, _ = hf_models.load(folder, attn_implementation="sdpa", kind="decoder")
    hf = hf.to(_dtype(torch, config.precision))
    packed = PackedDecoder.from_hf(hf, sinks=config.sinks, window_max=config.window_max)
    out = Path(config.out)
    with atomic.directory(out, owned=is_bundle, what="edgeattn bundle") as staging:
        progress(f"weights ({config.precision})")
        tensors = packed.state_dict()
        fp8_weights, fp8_cache = config.precision == "fp8", config.kv_cache == "fp8"
        if fp8_weights or fp8_cache:  # runtime/cuda/fp8_build.py: calibrate the cache's scales, quantize
            from edgeattn.runtime.cuda import fp8_build

            progress("fp8: " + ", ".join(["weights"] * fp8_weights + ["KV cache scales"] * fp8_cache))
            texts, what = (fp8_build.weight_calibration_texts(config.calibration)
                           if fp8_weights and config.fp8_rounding == "gptq" else ([], None))
            tensors, rounding = fp8_build.fp8_tensors(
                packed, tensors, weights=fp8_weights, cache=fp8_cache, rounding=config.fp8_rounding, texts=texts,
                encode=lambda text: tokenizer(text, add_special_tokens=False).input_ids,
                progress=lambda done, total: progress(f"fp8 weights: {done}/{total} matrices") if done % 30 == 0
                else None)
            if what:
                rounding["calibration"] = what
        require("safetensors", "building for the cuda target")
        from safetensors.torch import save_file

        save_file(tensors, str(staging / WEIGHTS_NAME))
        geometry = {**asdict(packed.shape), "rope_scaling": packed.rope_scaling, "model_type": hf.config.model_type,
                    "tied_embeddings": "lm_head" not in tensors}
        (staging / GEOMETRY_NAME).write_text(json.dumps(geometry, indent=1), encoding="utf-8")
        tokenizer.backend_tokenizer.save(str(staging / TOKENIZER_FILE))
        eos = hf.config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        special = {k: getattr(tokenizer, k) for k in ("bos_token", "eos_token") if getattr(tokenizer, k, None)}
        generation = {"chat_template": getattr(tokenizer, "chat_template", None), "eos_token_ids": eos,
                      "special_tokens": special}
        (staging / GENERATION_FILE).write_text(json.dumps(generation, indent=1), encoding="utf-8")
        kernel_files, kernels = [], {"archs": [], "kernels": []}
        if config.archs:
            dtype = "fp16" if config.precision == "fp16" else "bf16"
            progress(f"kernels for {', '.join(config.archs)}")
            only = (f"ring_decode_split-{dtype}-d{packed.shape.head_dim}*",  # the name ends in -causal
                    f"decode_reduce-{dtype}-d{packed.shape.head_dim}")
            if fp8_cache:  # the FP8 cache's ring kernel (plugins/kernels/ring_fp8.py)
                only += (f"ring_fp8_decode_split-{dtype}-d{packed.shape.head_dim}*",)
            kernels = compile_all(CompileConfig(out_dir=staging / KERNELS_DIR, archs=config.archs, only=only))
            kernel_files = [f"{KERNELS_DIR}/{p.name}" for p in sorted((staging / KERNELS_DIR).iterdir())
                            if p.is_file() and not p.name.startswith(".")]
        decoder = {"sinks": config.sinks, "window_max": config.window_max, "layers": packed.shape.layers,
                   "kv_heads": packed.shape.kv_heads, "head_dim": packed.shape.head_dim,
                   "vocab_size": packed.shape.vocab, "eos_token_ids": eos, "tokenizer": True,
                   "weights_bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
                   "cache_bytes_per_stream": packed.cache_bytes_per_stream()}
        sm = sorted({int(a.removeprefix("sm_")) for a in config.archs})
        precision = {"float": config.precision, "layers": layer_precision(tensors, config.precision)}
        if fp8_weights or fp8_cache:
            precision = fp8_build.precision_section(precision, packed.shape, weights=fp8_weights, cache=fp8_cache,
                                                    rounding=rounding)
        manifest = Manifest(
            name=config.name or check_model_name(Path(str(model)).name.replace(" ", "_")[:200] or "decoder", "name"),
            target={"name": "cuda", "backend": "cuda", "sm": sm, "precisions": list(CUDA_PRECISIONS + FP8_PRECISIONS)},
            backend="cuda", artifact=WEIGHTS_NAME, inputs=[], outputs=[], shape_ranges={},
            precision=precision,
            build_config={"target": "cuda", **{k: (list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Path)
                                                   else v) for k, v in asdict(config).items()}},
            toolchain={"edgeattn": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
                       **({"triton": kernels.get("triton")} if kernels.get("triton") else {})},
            source={"path": str(folder), "model_type": hf.config.model_type},
            sections={"decoder": decoder, "kernels": {"archs": kernels.get("archs", []),
                                                      "variants": sorted({k["variant"] for k in kernels["kernels"]})}},
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        )
        (staging / REPORT_NAME).write_text(_report(manifest), encoding="utf-8")
        manifest.hash_files(staging, [WEIGHTS_NAME, GEOMETRY_NAME, TOKENIZER_FILE, GENERATION_FILE, REPORT_NAME]
                            + kernel_files)
        (staging / MANIFEST_NAME).write_text(manifest.to_json(), encoding="utf-8")
    return open_bundle(out)


def _report(m: Manifest) -> str:
    d = m.sections["decoder"]
    return "\n".join([
        f"# {m.name} (cuda)", "",
        f"- precision: {m.precision['float']} (linear layers, attention and the KV cache)"
        if m.precision["float"] != "fp8" else "- precision: fp8 weights in the linear layers (bf16 elsewhere; below)",
        f"- cache: {d['sinks']} sinks + a ring of {d['window_max']} rows, "
        f"{d['cache_bytes_per_stream'] / 2**20:.1f} MiB a stream; weights {d['weights_bytes'] / 2**20:.1f} MiB",
        f"- ahead-of-time kernels: {', '.join(m.sections['kernels']['archs']) or 'none (compiled at first use)'}",
        *_fp8_lines(m.precision), ""])


def _fp8_lines(precision: dict) -> list[str]:
    if precision["float"] != "fp8" and precision.get("kv_cache") != "fp8":
        return []
    from edgeattn.runtime.cuda.fp8_build import report_lines

    return report_lines(precision)
