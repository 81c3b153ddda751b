"""edgeattn::WindowedAttention: the spec's reference, the ONNX forms, the torch module."""

DOMAIN = "edgeattn"
OP_TYPE = "WindowedAttention"
OPSET_VERSION = 1
