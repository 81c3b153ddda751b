"""Engines for the rtx (TensorRT for RTX) and orin / thor / h100 (TensorRT) targets: one builder for both.

The processed model is prepared for a strongly typed build (attention nodes marked for the plugin or the
portable body, float parts cast to the requested type), then built in a subprocess
(`edgeattn.engines.tensorrt.worker`) with optimization profiles from the shape plan, the target's compute
capabilities, sparse weights where the target has sparse tensor cores, and a timing cache per target.
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx_ir as ir

from edgeattn.engines.tensorrt import adapter, attention_mapping
from edgeattn.engines.tensorrt import layers as trt_layers
from edgeattn.engines.tensorrt import profiles as trt_profiles
from edgeattn.engines.builder import ArtifactResult, EngineJob
from edgeattn.errors import BuildError
from edgeattn.optional import require
from edgeattn.precision import summarize as graph_summary

ARTIFACT = "model.engine"
BUILD_TIMEOUT_S = 1800
# requested --precision -> the float type the graph is cast to (fp8 needs FP8 Q/DQ from quantization;
# the rest of the graph then runs in fp16)
FLOAT_TYPE = {"fp32": None, "fp16": "fp16", "bf16": "bf16", "fp8": "fp16"}


def _check_host(target, fl: adapter.Flavor) -> None:
    if not fl.available():
        require(fl.module, f"the {target.name} target")
    if fl.builds_without_gpu:
        return
    from edgeattn.targets import detect_gpu

    if not target.builds_on_host and platform.machine() != "aarch64":
        raise BuildError(f"target {target.name!r}: TensorRT engines for Jetson are built on the Jetson itself, "
                         f"found a {platform.machine()} host; copy the processed model there and build")
    if detect_gpu() is None:
        raise BuildError(f"target {target.name!r}: TensorRT needs a GPU to build, found none "
                         "(only TensorRT for RTX, target rtx, builds without one)")


def prepare_onnx(model: ir.Model, out: Path, target, precision: str) -> dict:
    """Mark attention nodes, cast float parts (in `model`, in place); write the engine's ONNX input to `out`."""
    import onnx
    import onnx_ir.passes.common as common

    common.ShapeInferencePass()(model)
    why_not = "" if target.attention_plugin else f"target {target.name} has no attention plugin"
    attention = attention_mapping.map_attention(model, target.attention_plugin, why_not)
    softmaxes = sum(1 for n in model.graph.all_nodes() if n.op_type == "Softmax")
    body_nodes = [n for f in model.functions.values() for n in f]
    # the parser names unnamed nodes (function bodies) node_of_<first output>
    compute_nodes = [n.name or f"node_of_{n.outputs[0].name}" for n in [*model.graph.all_nodes(), *body_nodes]
                     if n.op_type in ("MatMul", "Gemm", "Conv")]
    cast = None
    if FLOAT_TYPE[precision]:
        from edgeattn.engines.tensorrt.float_cast import cast_float_parts

        cast = cast_float_parts(model, FLOAT_TYPE[precision]).as_dict()
    # weights in a side file: no 2 GB protobuf limit, and the summary below reads the graph alone
    ir.save(model, out, external_data=out.name + ".data")
    del model
    return {"attention": attention, "softmax_outside_attention": softmaxes, "float_cast": cast,
            "compute_nodes": compute_nodes,
            "graph_precision": graph_summary(onnx.load(str(out), load_external_data=False))}


def _timing_cache(fl: adapter.Flavor, target) -> Path:
    return adapter.cache_dir() / "timing" / f"{fl.module}-{fl.version()}-{target.name}.cache"


def _unsupported_sms(error: str) -> set[int]:
    """SMs a failed build names as unable to compile the graph ("Cannot compile for target(s) sm75, because
    ..." / "Cannot compile operation 'x' for Turing (SM75): FP32 GEMM is not supported")."""
    found = set()
    for sentence in re.findall(r"Cannot compile[^.;]*", error):
        found |= {int(s) for s in re.findall(r"[Ss][Mm](\d+)", sentence)}
    return found


def _build_dropping_sms(job: dict, fl: adapter.Flavor, workdir: Path) -> tuple[dict, list[dict]]:
    """Build; when some compute capabilities cannot hold the graph (Turing has no FP32 GEMM and no INT4),
    build again in a fresh process without them, and say which were dropped and why."""
    dropped: list[dict] = []
    while True:
        try:
            return _run_worker(job, fl, workdir), dropped
        except BuildError as exc:
            bad = _unsupported_sms(str(exc)) & set(job["sm"])
            if not bad or len(bad) == len(job["sm"]):
                raise
            reason = re.search(r"Cannot compile[^.;]*", str(exc)).group(0)
            dropped += [{"sm": s, "reason": reason} for s in sorted(bad)]
            job = {**job, "sm": [s for s in job["sm"] if s not in bad]}


def _run_worker(job: dict, fl: adapter.Flavor, workdir: Path) -> dict:
    job_path, result_path = workdir / "job.json", workdir / "result.json"
    job_path.write_text(json.dumps(job))
    try:
        proc = subprocess.run([sys.executable, "-m", "edgeattn.engines.tensorrt.worker", str(job_path), str(result_path)],
                              env=adapter.subprocess_env(fl), capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BuildError(f"{fl.label} build took longer than {BUILD_TIMEOUT_S} s and was stopped") from None
    if not result_path.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise BuildError(f"the {fl.label} build process died (exit code {proc.returncode}): " + " | ".join(tail))
    result = json.loads(result_path.read_text())
    if not result.get("ok"):
        raise BuildError(f"{fl.label} could not build the engine: {result.get('error', 'unknown error')}")
    return result


def _problems(prep: dict, result: dict, summary: dict, precision: str, target) -> list[str]:
    problems = []
    plugin_layers = {la["name"] for la in result.get("network_layers", []) if la["type"].startswith("PLUGIN")}
    for rec in prep["attention"]:
        if rec["to"] == "body":
            problems.append(f"attention node {rec['node']} went to the portable body, not the plugin: {rec['reason']}")
        elif rec["node"] not in plugin_layers:
            rec.update(to="body", reason="the parser did not map it to the plugin (plugin not registered?)")
            problems.append(f"attention node {rec['node']} was inlined, not mapped to the plugin")
    if target.attention_plugin and not prep["attention"] and prep["softmax_outside_attention"]:
        problems.append(f"attention was not fused: {prep['softmax_outside_attention']} Softmax node(s) and no "
                        "edgeattn::WindowedAttention node, so no attention layer uses the plugin")
    if FLOAT_TYPE[precision] and summary["fp32_layers"]:
        left = summary["fp32_layers"]
        problems.append(f"--precision {precision}: {len(left)} compute layer(s) left in fp32: "
                        + ", ".join(left[:10]) + (" ..." if len(left) > 10 else ""))
    if precision == "fp8" and "fp8" not in " ".join(summary["compute_layers"]):
        problems.append("--precision fp8: no compute layer runs in FP8 (FP8 needs FP8 Q/DQ with calibrated scales "
                        "in the graph, from quantization)")
    graph_q = {k for k in prep["graph_precision"]["compute_layers"] if k != "float"}
    engine_q = {p for k in summary["compute_layers"] for p in k.split("+")}
    for kind in sorted(q for k in graph_q for q in k.split("/")):
        if kind not in engine_q:
            problems.append(f"the graph quantizes layers to {kind} but no engine compute layer runs in {kind}")
    return problems


def build_artifact(job: EngineJob) -> ArtifactResult:
    """Build `staging/model.engine` for a TensorRT or TensorRT for RTX target."""
    target, staging, precision = job.target, job.staging, job.precision
    fl = adapter.flavor(target.backend)
    _check_host(target, fl)
    sig = job.signature
    dim_profiles = trt_profiles.dim_profiles(job.shape_plan)
    with tempfile.TemporaryDirectory(prefix="edgeattn-trt-") as tmp:
        work = Path(tmp)
        prep = prepare_onnx(job.model, work / "engine_input.onnx", target, precision)
        job = {"flavor": fl.module, "onnx": str(work / "engine_input.onnx"), "engine": str(staging / ARTIFACT),
               "sm": list(target.sm), "sparse": target.sparse_tensor_cores,
               "hardware_compat": target.hardware_compat,
               "version_compatible": False, "plugin": bool(prep["attention"]) and target.attention_plugin,
               "profiles": [trt_profiles.input_shapes(sig.inputs, d) for d in dim_profiles],
               "timing_cache": str(_timing_cache(fl, target)), "inspect": True}
        result, dropped = _build_dropping_sms(job, fl, work)
    rows = result["layers"]
    trt_layers.mark_compute(rows, set(prep["compute_nodes"]))
    summary = trt_layers.summarize(rows)
    problems = _problems(prep, result, summary, precision, target)
    details = {
        "library": fl.label, "version": result["version"], "build_seconds": result["build_seconds"],
        "engine_bytes": result["engine_bytes"], "applied": result["applied"], "dropped_compute_capabilities": dropped,
        "profiles": [{k: list(v) for k, v in d.items()} for d in dim_profiles],
        "timing_cache": {"path": job["timing_cache"], "reused": result["timing_cache_loaded"]},
        "parser_flags": result["parser_flags"], "attention": prep["attention"],
        "plugin_registered": result.get("plugin_registered"), "float_cast": prep["float_cast"],
        "layer_source": result["layer_source"], "layers": rows,
        "runtime": "not run here: " + ("TensorRT for RTX engines need an RTX-class GPU (SM75-SM121)"
                                       if fl.builds_without_gpu else "needs the target GPU"),
    }
    precision = {"compute_layers": summary["compute_layers"], "float_layers": summary["fp32_layers"],
                 "engine_layers": summary["layers"], "layer_source": result["layer_source"],
                 "graph": prep["graph_precision"]}
    return ArtifactResult(ARTIFACT, {fl.module: result["version"]}, details, problems, precision,
                          parity_possible=False)
