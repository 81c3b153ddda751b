"""TensorRT and TensorRT for RTX behind one adapter: ONNX preparation (attention mapping, float casts),
optimization profiles, the build worker process and the per-layer report."""
