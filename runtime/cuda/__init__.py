"""Generation on NVIDIA GPUs: PyTorch + the project's Triton kernels, one CUDA graph a decode step.

torch is imported lazily by the modules that need it, so importing this package costs nothing.
"""
