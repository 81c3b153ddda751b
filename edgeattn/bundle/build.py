"""`edgeattn build`: ONNX model -> validated, rewritten, built, checked bundle (written atomically)."""

from __future__ import annotations

import datetime as _dt
import platform
import re
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import onnx
import onnx_ir as ir

from edgeattn import __version__, onnx_model
from edgeattn import atomic
from edgeattn.bundle.folder import Bundle, default_bundle_path, is_bundle, open_bundle
from edgeattn.engines.builder import builder_for
from edgeattn.errors import BuildError, BundleError, ConfigError, InputError, StrictModeError
from edgeattn.bundle.manifest import MANIFEST_NAME, REPORT_NAME, Manifest, check_model_name
from edgeattn.passes import PassContext, PassResult
from edgeattn.passes.inference_mode import inference_reference
from edgeattn.passes.registry import DEFAULT_PASSES, load_pass
from edgeattn.precision import summarize
from edgeattn.shapes import Range, check_range, plan
from edgeattn.targets import resolve_target

PROCESSED_NAME = "model.onnx"
FLOAT_PRECISIONS = ("fp32", "fp16", "bf16", "fp8")


@dataclass(frozen=True)
class BuildConfig:
    """How to build a bundle. Validated on construction."""

    target: str = "auto"
    out: Path | None = None
    precision: str = "fp32"  # float type of layers the graph does not already quantize
    batch: Range = (1, 1, 8)
    seq: Range = (1, 128, 512)
    dims: tuple[tuple[str, Range], ...] = ()  # per-dimension overrides, by dim name
    passes: tuple[str, ...] = DEFAULT_PASSES
    strict: bool = False  # fail when a requested fusion or precision did not happen
    parity: bool = True  # compare the built artifact with the source model where it can run here
    parity_tolerance: float | None = None  # None: 1e-4, or for Q/DQ graphs 5% of the largest output magnitude
    name: str | None = None
    attention_body: str = "auto"  # auto | blocked | dense: the op's ONNX body (passes/attention_body.py)
    as_inference: bool = False  # a training-mode export: remove Dropout instead of refusing (passes/inference_mode.py)
    cached_attention: str = "ops"  # ops | fused: a cpu decoder's cached attention (passes/cached_attention_cpu.py)

    def __post_init__(self) -> None:
        if self.attention_body not in ("auto", "blocked", "dense"):
            raise ConfigError(f"attention_body: expected auto, blocked or dense, found {self.attention_body!r}")
        if self.cached_attention not in ("ops", "fused"):
            raise ConfigError(f"cached_attention: expected ops or fused, found {self.cached_attention!r}")
        if self.precision not in FLOAT_PRECISIONS:
            raise ConfigError(f"precision: expected one of {', '.join(FLOAT_PRECISIONS)}, found {self.precision!r}")
        check_range(self.batch, "batch")
        check_range(self.seq, "seq")
        for name, r in self.dims:
            check_range(r, f"dimension {name}")
        if self.name is not None:
            try:
                check_model_name(self.name, "name")
            except BundleError as exc:
                raise ConfigError(str(exc)) from None
        if self.parity_tolerance is not None and not self.parity_tolerance > 0:
            raise ConfigError(f"parity_tolerance: expected > 0, found {self.parity_tolerance}")

    def as_dict(self) -> dict:
        d = asdict(self)
        d["out"] = str(self.out) if self.out else None
        d["dims"] = {k: list(v) for k, v in self.dims}
        return d


Progress = Callable[[str], None]


def _run_passes(model: onnx.ModelProto, names: tuple[str, ...], ctx: PassContext,
                progress: Progress) -> tuple[onnx.ModelProto, list[PassResult]]:
    ir_model = ir.serde.deserialize_model(model)
    results = []
    for name in names:
        progress(f"pass {name}")
        graph_pass = load_pass(name)
        try:
            results.append(graph_pass(ir_model, ctx))
        except (InputError, StrictModeError):
            raise  # the user's to fix, already said in full
        except Exception as exc:
            done = ", ".join(r.name for r in results) or "none"
            raise BuildError(f"graph pass {name!r} failed ({exc}); passes before it: {done}") from exc
    return ir.serde.serialize_model(ir_model), results


def build(model_path: str | Path, config: BuildConfig = BuildConfig(), *,
          progress: Progress = lambda msg: None, sections: dict | None = None) -> Bundle:
    """Build a bundle from an ONNX model. Nothing is written unless every step succeeds.

    `sections` are added to the manifest's sections (e.g. `pipeline`: the stages that made the model)."""
    model_path = Path(model_path)
    out = Path(config.out) if config.out else default_bundle_path(model_path)
    check_output(out, model_path)
    target, why = resolve_target(config.target)
    target.require_precision(config.precision)
    source = onnx_model.load(model_path)
    progress(f"target {target.name} ({why})")
    sig = onnx_model.signature(source)
    shape_plan = plan(sig, config.batch, config.seq, dict(config.dims))
    ctx = PassContext(target, config.as_dict())
    processed, results = _run_passes(source, config.passes, ctx, progress)
    try:
        onnx.checker.check_model(processed)
    except onnx.checker.ValidationError as exc:
        raise BuildError(f"the graph passes produced an invalid model: {str(exc).splitlines()[0]}") from None
    processed_sig = onnx_model.signature(processed)

    with atomic.directory(out, owned=is_bundle, what="edgeattn bundle") as staging:
        onnx.save(processed, str(staging / PROCESSED_NAME))
        progress(f"engine for {target.name} ({target.backend})")
        artifact = builder_for(target.backend)(staging / PROCESSED_NAME, staging, target, config, shape_plan)
        precision = summarize(source)  # Q/DQ, or integer kernels (MatMulNBits quantizes its activations too)
        quantized = precision["qdq_nodes"] > 0 or bool({"int4", "int8"} & set(precision["compute_layers"]))
        with tempfile.TemporaryDirectory() as tmp:  # --as-inference: check against the source as inference
            reference = inference_reference(source, Path(tmp), model_path.stem) if config.as_inference else model_path
            parity = _parity(reference, staging / artifact.artifact, processed_sig, shape_plan, config, artifact,
                             quantized)
        progress("parity: " + _parity_line(parity))
        from edgeattn.decoder.metadata import write_bundle_files  # decoders: tokenizer and cache geometry

        decoder_files, decoder = write_bundle_files({p.key: p.value for p in source.metadata_props}, staging)
        problems = [p for r in results for p in r.problems] + artifact.problems
        if config.strict and problems:
            raise StrictModeError(f"--strict: {len(problems)} problem(s), first: {problems[0]}")
        manifest = Manifest(
            name=config.name or _name_from(model_path),
            target=target.as_dict(),
            backend=target.backend,
            artifact=artifact.artifact,
            inputs=list(processed_sig.inputs),
            outputs=list(processed_sig.outputs),
            shape_ranges={k: list(v) for k, v in shape_plan.ranges.items()},
            precision={"float": config.precision, **(artifact.precision or summarize(processed))},
            build_config=config.as_dict(),
            toolchain=_toolchain(artifact.toolchain),
            source={"path": str(model_path.resolve()), "opset": sig.opset, "target_reason": why},
            sections={"passes": [r.as_dict() for r in results], "engine": artifact.details,
                      "parity": parity, "problems": problems,
                      "dimension_kinds": shape_plan.kinds, **({"decoder": decoder} if decoder else {}),
                      **(sections or {})},
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        )
        from edgeattn.bundle.report import render

        (staging / REPORT_NAME).write_text(render(manifest), encoding="utf-8")
        manifest.hash_files(staging, [PROCESSED_NAME, artifact.artifact, REPORT_NAME]
                            + artifact.details.get("extra_files", []) + decoder_files)
        (staging / MANIFEST_NAME).write_text(manifest.to_json(), encoding="utf-8")
    return open_bundle(out)


def _name_from(model_path: Path) -> str:
    """The file's stem made into a plain model name (it becomes a folder and URL part when served)."""
    name = re.sub(r"[^A-Za-z0-9_.+-]", "_", model_path.stem).lstrip(".-")[:200]
    return name or "model"


def check_output(out: Path, model_path: Path) -> None:
    """Refuse, before any work, an output that would replace the input or a folder we did not write."""
    out_abs, model_abs = Path(out).resolve(), Path(model_path).resolve()
    if out_abs == model_abs or out_abs in model_abs.parents:
        raise InputError(f"--out {out}: expected a folder that does not contain the model, found that it "
                         f"holds {model_path}; a build never replaces its own input")
    if out_abs.exists() and not is_bundle(out_abs):
        kind = "a folder that is not an edgeattn bundle" if out_abs.is_dir() else "a file"
        raise InputError(f"--out {out}: expected a new path or an earlier edgeattn bundle, found {kind}; "
                         f"choose another --out or remove it yourself")


def _parity(model_path: Path, artifact_path: Path, sig, shape_plan, config: BuildConfig, artifact,
            quantized: bool) -> dict:
    if not config.parity:
        return {"status": "skipped", "reason": "disabled (--no-parity)"}
    if not artifact.parity_possible or not artifact_path.name.endswith(".onnx"):
        return {"status": "skipped", "reason": "the artifact cannot run on this machine"}
    from edgeattn.bundle.parity import compare

    result = compare(model_path, artifact_path, sig.inputs, shape_plan.at("opt"))
    tolerance, basis = _tolerance(config, quantized, result["reference_max_abs"])
    ok = result["max_abs_diff"] <= tolerance
    result.update(status="pass" if ok else "fail", tolerance=tolerance, tolerance_basis=basis)
    if not ok:
        raise BuildError(f"parity check failed: the built model differs from {model_path.name} by "
                         f"{result['max_abs_diff']:.3g} (max abs), expected <= {tolerance:.3g} ({basis})")
    return result


QUANTIZED_RELATIVE_TOLERANCE = 0.05


def _tolerance(config: BuildConfig, quantized: bool, reference_max_abs: float) -> tuple[float, str]:
    """The parity bound: the user's, 1e-4 for float graphs, or relative for quantized ones.

    A quantized graph run by integer kernels (the cpu lowering) can round an activation one step
    differently from the float Q/DQ reference, and that step propagates, so an absolute 1e-4 is no bound.
    """
    if config.parity_tolerance is not None:
        return config.parity_tolerance, "--tolerance"
    if quantized:
        return (QUANTIZED_RELATIVE_TOLERANCE * max(reference_max_abs, 1e-6),
                f"{QUANTIZED_RELATIVE_TOLERANCE:.0%} of the largest output magnitude: a quantized graph")
    return 1e-4, "float graph"


def _parity_line(parity: dict) -> str:
    if parity.get("status") == "skipped":
        return f"skipped ({parity['reason']})"
    return f"{parity['status']}, max abs diff {parity['max_abs_diff']:.3g} (tolerance {parity['tolerance']:.3g})"


def _toolchain(extra: dict[str, str]) -> dict[str, str]:
    import onnxruntime

    return {"edgeattn": __version__, "python": platform.python_version(), "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__, "onnx_ir": ir.__version__, **extra}
