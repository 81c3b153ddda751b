"""One TensorRT / TensorRT for RTX engine build, run in its own process.

`python -m edgeattn.engines.tensorrt.worker JOB.json RESULT.json`. A failed build can leave the library in a
state that changes the next build in the same process, and a CUDA-less runtime can crash the process,
so `edgeattn.engines.tensorrt.builder` starts one of these per build and reads RESULT.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from edgeattn.engines.tensorrt import adapter
from edgeattn.engines.tensorrt import layers as trt_layers
from edgeattn.gpu import detect_gpu


def _logger(trt, lines: list[str]):
    class Collecting(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity, msg):
            lines.append(f"{severity.name}: {msg}")

    return Collecting()


def _profiles(builder, network, profiles: list[dict]):
    for shapes in profiles:
        profile = builder.create_optimization_profile()
        for i in range(network.num_inputs):
            tensor = network.get_input(i)
            if tensor.name in shapes:
                lo, opt, hi = shapes[tensor.name]
                profile.set_shape(tensor.name, lo, opt, hi)
        yield profile


def run(job: dict) -> dict:
    fl = adapter.flavor(job["flavor"])
    trt = fl.load()
    lines: list[str] = []
    logger = _logger(trt, lines)
    result: dict = {"ok": False, "version": trt.__version__}
    if job.get("plugin"):
        from edgeattn.plugins.tensorrt.rtx import register

        result["plugin_registered"] = register(trt)
    builder = trt.Builder(logger)
    network = adapter.create_network(trt, builder)
    parser = trt.OnnxParser(network, logger)
    result["parser_flags"] = adapter.parser_flags(trt, parser) if job.get("plugin") else []
    if not parser.parse_from_file(job["onnx"]):
        result["error"] = "the ONNX parser failed: " + "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        result["log_tail"] = lines[-20:]
        return result
    result["network_layers"] = [{"name": network.get_layer(i).name, "type": str(network.get_layer(i).type).split(".")[-1]}
                                for i in range(network.num_layers)]
    config = builder.create_builder_config()
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    result["applied"] = adapter.configure_target(trt, config, fl, job["sm"], job["sparse"], job.get("hardware_compat"),
                                                 job.get("version_compatible", False))
    for profile in _profiles(builder, network, job["profiles"]):
        config.add_optimization_profile(profile)
    cache_path = Path(job["timing_cache"]) if job.get("timing_cache") else None
    cache_bytes = cache_path.read_bytes() if cache_path and cache_path.is_file() else b""
    cache = config.create_timing_cache(cache_bytes)
    config.set_timing_cache(cache, ignore_mismatch=False)
    result["timing_cache_loaded"] = bool(cache_bytes)
    start = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    result["build_seconds"] = round(time.perf_counter() - start, 3)
    if serialized is None:
        errors = [ln for ln in lines if ln.startswith(("ERROR", "INTERNAL_ERROR"))]
        result["error"] = "build_serialized_network returned nothing: " + ("; ".join(errors[-3:]) or "no error logged")
        return result
    Path(job["engine"]).write_bytes(bytes(serialized))
    result["engine_bytes"] = serialized.nbytes
    if cache_path:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        cache_path.write_bytes(bytes(config.get_timing_cache().serialize()))
    rows, source = trt_layers.from_log("\n".join(lines)), "detailed build log (no GPU)"
    if job.get("inspect") and detect_gpu() is not None:  # only with a GPU: a CUDA-less runtime can crash the process
        engine = trt.Runtime(logger).deserialize_cuda_engine(serialized)
        if engine is not None:  # e.g. an rtx engine on a GPU it was not built for: keep the log's rows
            rows, source = trt_layers.from_inspector(adapter.inspector_layers(trt, engine)), "engine inspector"
    result.update(ok=True, layers=rows, layer_source=source,
                  warnings=[ln for ln in lines if ln.startswith("WARNING")][:50])
    return result


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    try:
        result = run(job)
    except Exception as exc:  # reported to the parent, which raises BuildError
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    Path(argv[1]).write_text(json.dumps(result))
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
