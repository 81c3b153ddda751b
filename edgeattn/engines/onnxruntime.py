"""The cpu target's artifact: an ONNX Runtime-optimized model, saved once at build time."""

from __future__ import annotations

from edgeattn.engines.builder import ArtifactResult, EngineJob
from edgeattn.errors import BuildError

ARTIFACT = "model.ort.onnx"
SHARED_MIN_BYTES = 1024  # smaller initializers stay in the graph


def build_artifact(job: EngineJob) -> ArtifactResult:
    """Run ONNX Runtime's portable graph optimizations and save the result (ORT_ENABLE_EXTENDED:
    fusions that run on any CPU; layout-specific ones are redone at load time)."""
    import onnxruntime as ort

    out = job.staging / ARTIFACT
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(out)
    options.log_severity_level = 3
    if job.weights_file:  # weights beside the graph, where a second graph of the bundle can point at them
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", job.weights_file)
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                         str(SHARED_MIN_BYTES))
    try:
        session = ort.InferenceSession(str(job.model_path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise BuildError(f"ONNX Runtime could not load the processed model: {exc}") from None
    del session
    import onnx

    ops: dict[str, int] = {}
    for node in onnx.load(str(out), load_external_data=False).graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    details = {"optimization": "ORT_ENABLE_EXTENDED", "op_counts": dict(sorted(ops.items()))}
    if job.weights_file:
        details["extra_files"] = [job.weights_file]
    return ArtifactResult(ARTIFACT, {"onnxruntime": ort.__version__}, details)

