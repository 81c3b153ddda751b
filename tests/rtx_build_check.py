"""Parse and build one ONNX file with TensorRT for RTX on the CPU (run as a subprocess: one build per process).

    python tests/rtx_build_check.py MODEL.onnx   -> prints 'built <bytes>' or the parser / builder errors
"""

import sys

import tensorrt_rtx as trt

logger = trt.Logger(trt.Logger.WARNING)
builder = trt.Builder(logger)
network = builder.create_network(0)
parser = trt.OnnxParser(network, logger)
if not parser.parse_from_file(sys.argv[1]):
    for i in range(parser.num_errors):
        print("parse error:", parser.get_error(i))
    sys.exit(2)
config = builder.create_builder_config()
config.num_compute_capabilities = 1
config.set_compute_capability(trt.ComputeCapability.SM89, 0)
profile = builder.create_optimization_profile()
for i in range(network.num_inputs):
    name = network.get_input(i).name
    profile.set_shape(name, (1, 4), (2, 16), (4, 32))
config.add_optimization_profile(profile)
engine = builder.build_serialized_network(network, config)
if engine is None:
    print("build failed")
    sys.exit(3)
print("built", engine.nbytes)
