"""edgeattn: take transformer models to Jetson (Orin, Thor) and H100.

Stages, each usable alone: quantize -> sparsify -> export -> build -> run.
Importing this package is cheap: torch, TensorRT and Triton load only where a stage needs them.
"""
__version__ = "0.1.0"

from edgeattn.errors import EdgeAttnError  # noqa: E402

__all__ = ["EdgeAttnError", "__version__"]
