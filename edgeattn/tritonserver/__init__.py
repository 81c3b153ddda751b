"""Triton Inference Server (the NVIDIA serving product, not the Triton kernel language): model repositories
written by `edgeattn export-triton`, and the Python-backend model that runs a bundle inside the server."""
