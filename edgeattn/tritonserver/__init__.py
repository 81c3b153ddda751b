"""Triton Inference Server (the NVIDIA serving product, not the Triton kernel language): model repositories
written by `edgeattn export-triton`, the Python-backend models that run bundles inside the server (encoders,
and decoders streaming text), and a runner for the `tritonserver` that the nvidia-pytriton wheel ships."""
