#!/usr/bin/env bash
# The main job on the embedded default (ONNX Runtime on the CPU), from a fresh machine:
# install, export all-MiniLM-L6-v2 to ONNX, build a bundle, check it, and time it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
mkdir -p build
edgeattn export minilm --out build/minilm.onnx
edgeattn build build/minilm.onnx --target cpu --out build/minilm.edgeattn
edgeattn bench build/minilm.edgeattn --warmup 5 --iterations 50
