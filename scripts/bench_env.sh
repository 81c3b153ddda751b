#!/usr/bin/env bash
# The benchmark environment for the generation peers: .venv-bench, beside .venv, with
# onnxruntime-genai and llama-cpp-python. These are never dependencies of edgeattn; only
# benchmarks/generation_cpu.py uses them (`speed --peers`). Safe to run again.
#
# .venv-bench sees everything .venv has (edgeattn, onnxruntime, torch, transformers, the SmolLM2 GGUF)
# through a .pth file that adds .venv's site-packages; `--system-site-packages` would not do it, since
# .venv is itself a venv. llama-cpp-python compiles llama.cpp from source (cmake and a C compiler;
# 10-20 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."

[ -x .venv/bin/python ] || { echo "run scripts/setup.sh first (.venv is missing)" >&2; exit 1; }
PY=.venv/bin/python
[ -x .venv-bench/bin/python ] || "$PY" -m venv .venv-bench
MAIN_SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
BENCH_SITE=$(.venv-bench/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# addsitedir (not a bare path line) so .venv's own .pth files run too: edgeattn is an editable install there.
echo "import site; site.addsitedir('$MAIN_SITE')" > "$BENCH_SITE/_edgeattn_main_venv.pth"

PIP=".venv-bench/bin/python -m pip"
# --no-deps for both: their dependencies (numpy, onnxruntime) come from .venv, at the versions edgeattn uses.
$PIP install -q --no-deps "onnxruntime-genai==${ORT_GENAI_VERSION:-0.18.0}"
if ! .venv-bench/bin/python -c "import llama_cpp" 2>/dev/null; then
  # Its pure-Python dependencies first (small), then the source build of llama.cpp.
  $PIP install -q diskcache jinja2 typing-extensions
  CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
    $PIP install --no-deps "llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
fi
.venv-bench/bin/python - <<'EOF'
import onnxruntime_genai, llama_cpp, edgeattn
print(f"onnxruntime-genai {onnxruntime_genai.__version__}, llama-cpp-python {llama_cpp.__version__}, "
      f"edgeattn from {edgeattn.__file__}: .venv-bench ready")
EOF
