"""`edgeattn build`: ONNX model -> validated, rewritten, built, checked bundle (written atomically).

The model is read once and held as onnx-ir from the passes to the engine builder: the target's build plan
(`edgeattn.passes.plans`) rewrites it in place, it is written once as the processed `model.onnx` (the file
ONNX Runtime and the TensorRT parser read), and the builder gets it with its signature
(`edgeattn.engines.builder.EngineJob`). A cpu decoder also gets the fast path, the second plan run on a
copy of the source.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import tempfile
from pathlib import Path
from typing import Callable

import onnx
import onnx_ir as ir

from edgeattn import __version__, onnx_model
from edgeattn import atomic
from edgeattn.bundle import fast_path as fast
from edgeattn.bundle import parity as parity_check
from edgeattn.bundle.config import BuildConfig, check_inputs, name_from
from edgeattn.bundle.folder import Bundle, is_bundle, open_bundle
from edgeattn.bundle.manifest import MANIFEST_NAME, REPORT_NAME, Manifest
from edgeattn.decoder.metadata import DECODER_KEY, write_bundle_files
from edgeattn.engines.builder import EngineJob, builder_for
from edgeattn.errors import BuildError, ConfigError, StrictModeError
from edgeattn.passes import PassContext
from edgeattn.passes.inference_mode import inference_reference
from edgeattn.passes.plans import BuildPlan, fast_path_of, plan_for
from edgeattn.precision import summarize
from edgeattn.shapes import Range, ShapePlan
from edgeattn.shapes import plan as shape_plan_for
from edgeattn.targets import resolve_target

__all__ = ["BuildConfig", "build"]

PROCESSED_NAME = "model.onnx"
FAST_PATH_NAME = fast.FAST_PATH_NAME
SHARED_WEIGHTS_NAME = "model.weights"  # a cpu decoder's weights: the ring graph's, and the fast path reads them too
DEFAULT_SEQ: Range = (1, 128, 512)
CACHE_DIM = "cache"  # a decoder's cache rows (edgeattn.decoder.export): sinks + the ring

Progress = Callable[[str], None]


def build(model_path: str | Path, config: BuildConfig = BuildConfig(), *,
          progress: Progress = lambda msg: None, sections: dict | None = None, plan: BuildPlan | None = None) -> Bundle:
    """Build a bundle from an ONNX model. Nothing is written unless every step succeeds.

    `sections` are added to the manifest's sections (e.g. `pipeline`: the stages that made the model);
    `plan` replaces the target's build plan (`edgeattn.passes.plans.plan_for`)."""
    model_path = Path(model_path)
    out = check_inputs(model_path, config)
    target, why = resolve_target(config.target)
    target.require_precision(config.precision)
    source = onnx_model.load(model_path)  # the one read of the model file
    progress(f"target {target.name} ({why})")
    metadata = {p.key: p.value for p in source.metadata_props}
    decoder_info = json.loads(metadata[DECODER_KEY]) if DECODER_KEY in metadata else None
    sig = onnx_model.signature(source)
    seq, shape_plan = sample_shapes(sig, config, decoder_info)
    plan = plan or plan_for(target.backend)
    if config.passes is not None:
        plan = plan.only(config.passes)
    ctx = PassContext(target, seq=seq, attention_body=config.attention_body, cached_attention=config.cached_attention,
                      strict=config.strict, as_inference=config.as_inference)
    model = ir.serde.deserialize_model(source)
    fast_source = None
    if decoder_info and config.fast_path and target.backend == "onnxruntime":
        fast_source = model.clone()  # the fast path plan's own graph, before the passes (weights shared)
    progress(f"plan {plan.name}: {len(plan.passes)} passes")
    results = plan.run(model, ctx, progress)
    processed = ir.serde.serialize_model(model)
    try:
        onnx.checker.check_model(processed)
    except onnx.checker.ValidationError as exc:
        raise BuildError(f"the graph passes produced an invalid model: {str(exc).splitlines()[0]}") from None
    processed_sig = onnx_model.signature(processed)
    processed_precision = summarize(processed)
    precision = summarize(source)  # Q/DQ, or integer kernels (MatMulNBits quantizes its activations too)
    quantized = precision["qdq_nodes"] > 0 or bool({"int4", "int8"} & set(precision["compute_layers"]))

    with atomic.directory(out, owned=is_bundle, what="edgeattn bundle") as staging:
        onnx.save(processed, str(staging / PROCESSED_NAME))  # written once: the file the builder's library reads
        del processed
        progress(f"engine for {target.name} ({target.backend})")
        weights = SHARED_WEIGHTS_NAME if fast_source is not None else None  # the ring graph's, for the fast path
        artifact = builder_for(target.backend)(EngineJob(model, staging / PROCESSED_NAME, processed_sig, staging,
                                                         target, config.precision, shape_plan, weights))
        del model
        decoder_files, decoder = write_bundle_files(metadata, staging) if decoder_info else ([], None)
        fast_details = None
        if fast_source is not None:
            fast_details = fast.build_fast_path(fast_source, fast_path_of(plan), ctx, results, decoder,
                                                staging / FAST_PATH_NAME, progress, staging / artifact.artifact)
            del fast_source
        parity, fast_problems = _check(source, model_path, staging, artifact, processed_sig, shape_plan, config, quantized,
                                       decoder, fast_details, progress)
        if decoder is not None and (staging / FAST_PATH_NAME).exists():
            decoder["fast_path_model"] = FAST_PATH_NAME
            decoder_files.append(FAST_PATH_NAME)
            decoder["fast_path_shared_bytes"] = fast_details["shared_bytes"]  # weights it reads from the artifact's
            decoder["fast_path_rotation"] = sorted(set((fast_details.get("rotary") or {}).values()))  # how, or why not
            if fast_details.get("rotary_rows"):  # its rotation tables end there: later positions take the ring graph
                decoder["fast_path_positions"] = fast_details["rotary_rows"]
        kept = _kept_files(staging, artifact.artifact, decoder)
        if decoder is not None and decoder.get("fast_path_shared_bytes"):
            kept["note"]["shared_weights"] = (f"{FAST_PATH_NAME} reads {decoder['fast_path_shared_bytes'] / 2**20:.1f} "
                                              f"MiB of its weights from {SHARED_WEIGHTS_NAME}, {artifact.artifact}'s "
                                              f"side file: one copy of them on disk")
            kept["note"]["summary"] = "; ".join(n for n in (kept["note"].get("summary"), kept["note"]["shared_weights"]) if n)
        problems = [p for r in results for p in r.problems] + artifact.problems + fast_problems
        if config.strict and problems:
            raise StrictModeError(f"--strict: {len(problems)} problem(s), first: {problems[0]}")
        manifest = Manifest(
            name=config.name or name_from(model_path),
            target=target.as_dict(),
            backend=target.backend,
            artifact=artifact.artifact,
            inputs=list(processed_sig.inputs),
            outputs=list(processed_sig.outputs),
            shape_ranges={k: list(v) for k, v in shape_plan.ranges.items()},
            precision={"float": config.precision, **(artifact.precision or processed_precision)},
            build_config={**config.as_dict(), "seq": list(seq), "plan": plan.name, "passes": list(plan.passes)},
            toolchain=_toolchain(artifact.toolchain),
            source={"path": str(model_path.resolve()), "opset": sig.opset, "target_reason": why},
            sections={"passes": [r.as_dict() for r in results], "engine": artifact.details,
                      "parity": parity, "problems": problems, "files": kept["note"],
                      "dimension_kinds": shape_plan.kinds, **({"decoder": decoder} if decoder else {}),
                      **(sections or {})},
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        )
        from edgeattn.bundle.report import render

        (staging / REPORT_NAME).write_text(render(manifest), encoding="utf-8")
        manifest.hash_files(staging, kept["names"] + [REPORT_NAME] + artifact.details.get("extra_files", [])
                            + decoder_files)
        (staging / MANIFEST_NAME).write_text(manifest.to_json(), encoding="utf-8")
    return open_bundle(out)


def sample_shapes(sig, config: BuildConfig, decoder: dict | None) -> tuple[Range, ShapePlan]:
    """The sequence range and every dynamic dimension's range.

    A decoder's cache dimension is its cache layout (sinks + window_max rows, from its metadata), never
    the sequence range: `--seq` is the chunk length, by default 1 to the ring's size."""
    dims = dict(config.dims)
    derived = {}
    if decoder is None:
        return (seq := config.seq or DEFAULT_SEQ), shape_plan_for(sig, config.batch, seq, dims)
    sinks, window = int(decoder["sinks"]), int(decoder["window_max"])
    seq = config.seq or (1, 1, window)
    derived[CACHE_DIM] = ((min(sinks + 1, sinks + window), sinks + window, sinks + window), "cache")
    if CACHE_DIM in dims and dims[CACHE_DIM][0] <= sinks:
        raise ConfigError(f"--dim {CACHE_DIM}={':'.join(map(str, dims[CACHE_DIM]))}: expected at least "
                          f"{sinks + 1} rows (the {sinks} sink rows and one of the ring), found {dims[CACHE_DIM][0]}")
    return seq, shape_plan_for(sig, config.batch, seq, dims, derived)


PARITY_CHUNK = 8  # a decoder's parity chunk: a prefill of 8 tokens, so greedy agreement counts 8 positions


def parity_sizes(shape_plan: ShapePlan, decoder: dict | None) -> dict[str, int]:
    """The sizes parity runs at: the plan's opt sizes; a decoder's chunk at least PARITY_CHUNK tokens (its
    opt is a decode step, one token) where the range allows."""
    sizes = shape_plan.at("opt")
    if decoder is not None:
        for dim, kind in shape_plan.kinds.items():
            if kind == "seq":
                sizes[dim] = max(sizes[dim], min(PARITY_CHUNK, shape_plan.ranges[dim][2]))
    return sizes


def _kept_files(staging: Path, artifact: str, decoder: dict | None) -> dict:
    """Which model files the bundle keeps. A cpu decoder's runtime loads the artifact (the ONNX Runtime-
    optimized model) and the fast path, never the processed model.onnx: that copy of the weights goes."""
    processed = staging / PROCESSED_NAME
    if decoder is not None and artifact != PROCESSED_NAME and artifact.endswith(".onnx"):
        size = processed.stat().st_size
        processed.unlink()
        note = (f"{PROCESSED_NAME} left out ({size / 2**20:.1f} MiB): the runtime loads {artifact}, the same "
                f"graph after ONNX Runtime's optimizations")
        return {"names": [artifact], "note": {"summary": note, "processed_model": note}}
    return {"names": [PROCESSED_NAME, artifact] if artifact != PROCESSED_NAME else [artifact],
            "note": {"processed_model": PROCESSED_NAME}}


def _check(source: onnx.ModelProto, model_path: Path, staging: Path, artifact, sig, shape_plan: ShapePlan, config: BuildConfig,
           quantized: bool, decoder: dict | None, fast_details: dict | None, progress: Progress
           ) -> tuple[dict, list[str]]:
    """Parity of the artifact with the source and, for a decoder, of the fast path with the artifact; the
    artifact is opened once for both. A fast path that fails (quantized graphs only) is removed."""
    fast_problems: list[str] = []
    fast_path = staging / FAST_PATH_NAME if fast_details is not None else None
    skipped = None
    if not config.parity:
        skipped = {"status": "skipped", "reason": "disabled (--no-parity)"}
    elif not artifact.parity_possible or not artifact.artifact.endswith(".onnx"):
        skipped = {"status": "skipped", "reason": "the artifact cannot run on this machine"}
    if skipped:
        progress("parity: " + parity_line(skipped))
        if decoder is not None and fast_path is not None:
            decoder["fast_path_parity"] = skipped
        return skipped, fast_problems
    from edgeattn.runtime.backends.onnxruntime import OnnxRuntimeBackend

    with OnnxRuntimeBackend(staging / artifact.artifact) as built, tempfile.TemporaryDirectory() as tmp:
        # --as-inference: check against the source as inference
        reference = inference_reference(source, Path(tmp), model_path.stem) \
            if config.as_inference else model_path
        result = parity_check.compare(reference, built, sig.inputs, parity_sizes(shape_plan, decoder))
        parity = judge(result, config, quantized)
        progress("parity: " + parity_line(parity))
        if parity["status"] == "fail":
            raise BuildError(f"parity check failed: the built model differs from {model_path.name} by "
                             f"{parity['relative_diff']:.3g} of its largest output (max abs diff "
                             f"{parity['max_abs_diff']:.3g} / max abs {parity['reference_max_abs']:.3g}), expected "
                             f"<= {parity['tolerance']:.3g} ({parity['tolerance_basis']})")
        if fast_path is not None and fast_path.exists():
            check = judge(fast.compare_fast_path(built, fast_path, decoder), config, quantized)
            progress("fast path parity: " + parity_line(check))
            decoder["fast_path_parity"] = check
            if check["status"] == "fail" and not quantized:
                raise BuildError(f"the fast path differs from {artifact.artifact} by {check['relative_diff']:.3g} "
                                 f"of its largest output, expected <= {check['tolerance']:.3g} "
                                 f"({check['tolerance_basis']}); build with --no-fast-path to leave it out")
            if check["status"] == "fail":  # quantized: integer rounding, not a bug
                fast_path.unlink()
                fast_problems.append(f"fast path left out: it differs from {artifact.artifact} by "
                                     f"{check['relative_diff']:.3g} of its largest output, more than "
                                     f"{check['tolerance']:.3g}")
    return parity, fast_problems


FLOAT_RELATIVE_TOLERANCE = 1e-4
QUANTIZED_RELATIVE_TOLERANCE = 0.05


def judge(result: dict, config: BuildConfig, quantized: bool) -> dict:
    """A comparison judged on the outputs' own scale: max abs diff / max abs reference output, against
    --tolerance, 1e-4 for float graphs, or 5% for quantized ones.

    An absolute bound is no bound: a decoder's logits reach 30 and more, where float32 reordering alone
    differs by more than 1e-4. A quantized graph run by integer kernels (the cpu lowering) can round an
    activation one step differently from the float Q/DQ reference, and that step propagates."""
    scale = max(float(result["reference_max_abs"]), 1e-6)
    relative = float(result["max_abs_diff"]) / scale
    if config.parity_tolerance is not None:
        tolerance, basis = config.parity_tolerance, "--tolerance"
    elif quantized:
        tolerance, basis = QUANTIZED_RELATIVE_TOLERANCE, "a quantized graph"
    else:
        tolerance, basis = FLOAT_RELATIVE_TOLERANCE, "a float graph"
    return {**result, "compared": "max abs diff / max abs reference output" + (
        "; greedy (argmax) agreement of the logits" if "greedy_agreement" in result else ""),
        "relative_diff": relative, "tolerance": tolerance, "tolerance_basis": basis,
        "status": "pass" if relative <= tolerance else "fail"}


def parity_line(parity: dict) -> str:
    if parity.get("status") == "skipped":
        return f"skipped ({parity['reason']})"
    line = (f"{parity['status']}, relative diff {parity['relative_diff']:.3g} (max abs diff "
            f"{parity['max_abs_diff']:.3g} of outputs up to {parity['reference_max_abs']:.3g}; tolerance "
            f"{parity['tolerance']:.3g}, {parity['tolerance_basis']})")
    if "greedy_agreement" in parity:
        line += f", greedy agreement {parity['greedy_agreement']:.0%}"
    return line


def _toolchain(extra: dict[str, str]) -> dict[str, str]:
    import onnxruntime

    return {"edgeattn": __version__, "python": platform.python_version(), "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__, "onnx_ir": ir.__version__, **extra}

