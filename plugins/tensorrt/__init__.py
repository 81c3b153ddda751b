"""TensorRT plugins for edgeattn::WindowedAttention: the TensorRT for RTX Python plugin and the AOT plugin."""
