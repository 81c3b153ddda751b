"""Engine builders, one per backend: the builder protocol, ONNX Runtime, and TensorRT (full and for RTX)."""
