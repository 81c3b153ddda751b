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
    fast_path: bool = True  # cpu decoders: also the linear form, for streams still inside their window (LINEAR_NAME)

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
        linear = _linear_form(source, config, ctx, results, staging, progress, decoder) if decoder else None
        linear_problems = []
        if linear:
            check = (_linear_parity(staging, artifact.artifact, decoder, config, quantized)
                     if config.parity else {"status": "skipped", "reason": "disabled (--no-parity)"})
            progress("linear form parity: " + _parity_line(check))
            decoder["linear_parity"] = check
            if check["status"] == "fail":  # quantized only (a float graph raised): integer rounding, not a bug
                (staging / LINEAR_NAME).unlink()
                linear_problems.append(f"linear form left out: it differs from {artifact.artifact} by "
                                       f"{check['max_abs_diff']:.3g}, more than {check['tolerance']:.3g}")
            else:
                decoder["linear_model"] = LINEAR_NAME
                decoder_files.append(LINEAR_NAME)
                decoder["linear_rotation"] = sorted(set((linear.get("rotary") or {}).values()))  # how, or why not
                if linear.get("rotary_rows"):  # its rotation tables end there: later positions take the ring graph
                    decoder["linear_positions"] = linear["rotary_rows"]
        problems = [p for r in results for p in r.problems] + artifact.problems + linear_problems
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


LINEAR_NAME = "model.linear.onnx"


def _linear_form(source: onnx.ModelProto, config: BuildConfig, ctx: PassContext, results: list[PassResult],
                 staging: Path, progress: Progress, decoder: dict) -> dict | None:
    """A cpu decoder's second graph: the same passes with the cached attention as GroupQueryAttention over the
    cache buffers themselves (cached_attention_gqa.emit_linear). The runtime runs it, with the present outputs
    bound to the cache's memory, for the steps of streams that have not left their window (no ring wrap and
    t <= sinks + W: plain causal attention), and the ring graph for every other step. Written only when every
    layer took that form."""
    lowering = next((r for r in results if r.name == "lower-cached-cpu"), None)
    if not config.fast_path or lowering is None or not lowering.details.get("lowered"):
        return None
    # rotation tables as constants over the model's positions (and at least the default ring's)
    rows = max(int(decoder.get("max_positions") or 0), int(decoder["sinks"]) + int(decoder["window_max"]))
    options = {**ctx.options, "cached_attention": "linear", "rotary_rows": rows}
    linear, linear_results = _run_passes(source, config.passes, PassContext(ctx.target, options), lambda m: None)
    done = dict(next(r for r in linear_results if r.name == "lower-cached-cpu").details)
    if done.get("group_query_attention") != lowering.details["lowered"]:
        progress(f"linear form: not written ({done.get('plain') or done.get('kept')})")
        return None
    rotary = done.get("rotary") or {}
    if rotary and all(how.startswith("constant") for how in rotary.values()):
        done["rotary_rows"] = rows
    else:
        progress(f"linear form: the step's own rotation tables ({sorted(set(rotary.values()))})")
    from edgeattn.decoder.metadata import LOGITS_TO_KEEP

    kept = [t for t in linear.graph.initializer if t.name != LOGITS_TO_KEEP]  # an input the runtime always binds
    del linear.graph.initializer[:]
    linear.graph.initializer.extend(kept)
    onnx.save(linear, str(staging / LINEAR_NAME))
    progress(f"linear form: {LINEAR_NAME} ({done['group_query_attention']} layers on GroupQueryAttention)")
    return done


def _linear_parity(staging: Path, artifact: str, decoder: dict, config: BuildConfig, quantized: bool) -> dict:
    """The linear form against the ring artifact: a 6-token chunk at position 0 then one token, both from empty
    caches, every position's logits (the linear form's present outputs bound to the cache's memory)."""
    import numpy as np
    import onnxruntime as ort

    from edgeattn.decoder.metadata import LOGITS_TO_KEEP, past_names, present_names

    layers, kv, d = int(decoder["layers"]), int(decoder["kv_heads"]), int(decoder["head_dim"])
    capacity = int(decoder["sinks"]) + 16
    options = ort.SessionOptions()
    options.log_severity_level = 3
    ring = ort.InferenceSession(str(staging / artifact), options, providers=["CPUExecutionProvider"])
    linear = ort.InferenceSession(str(staging / LINEAR_NAME), options, providers=["CPUExecutionProvider"])
    ring_names = {i.name for i in ring.get_inputs()}
    caches = [np.zeros((1, kv, capacity, d), np.float32) for _ in range(2 * layers)]
    io = linear.io_binding()
    held = [ort.OrtValue.ortvalue_from_numpy(c) for c in caches]
    for past, present, value in zip(past_names(layers), present_names(layers), held):
        io.bind_ortvalue_input(past, value)
        io.bind_ortvalue_output(present, value)
    rng = np.random.default_rng(0)
    worst, largest, position = 0.0, 0.0, 0
    ring_caches = [np.zeros_like(c) for c in caches]
    for chunk in (6, 1):
        ids = rng.integers(0, int(decoder["vocab_size"]), (1, chunk)).astype(np.int64)
        feeds = {"input_ids": ids, "cache_position": np.array([position], np.int64),
                 "attention_window": np.array(0, np.int64)}
        outs = dict(zip([o.name for o in ring.get_outputs()],
                        ring.run(None, {**{k: v for k, v in feeds.items() if k in ring_names},
                                        **dict(zip(past_names(layers), ring_caches))})))
        for name, buf in zip(present_names(layers), ring_caches):  # the ring's new rows (no wrap here)
            buf[:, :, position:position + chunk] = outs[name]
        for name, value in feeds.items():
            io.bind_cpu_input(name, value)
        io.bind_cpu_input(LOGITS_TO_KEEP, np.array(0, np.int64))
        io.bind_output("logits")
        linear.run_with_iobinding(io)
        got = io.get_outputs()[-1].numpy()
        worst = max(worst, float(np.abs(got - outs["logits"]).max()))
        largest = max(largest, float(np.abs(outs["logits"]).max()))
        position += chunk
    tolerance, basis = _tolerance(config, quantized, largest)
    result = {"max_abs_diff": worst, "reference_max_abs": largest, "tolerance": tolerance, "tolerance_basis": basis,
              "status": "pass" if worst <= tolerance else "fail"}
    if worst > tolerance and not quantized:
        raise BuildError(f"the linear form differs from {artifact} by {worst:.3g} (max abs), expected <= "
                         f"{tolerance:.3g} ({basis}); build with --no-fast-path to leave it out")
    return result


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
