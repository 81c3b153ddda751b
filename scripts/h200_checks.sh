#!/usr/bin/env bash
# The checks that need the lent H200 (no internet there; its image has torch, triton, onnx, scipy, NVML):
# GPU tests, then `edgeattn thermal record --source nvml` under a load with on/off phases, and `fit`.
# Results go to $OUT (the device tool brings that folder back).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/h200-checks}
mkdir -p "$OUT"
if [ -d .whl ]; then  # a newer setuptools for the editable install, carried as wheels
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { tail "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
python3 -m pytest -q -p no:cacheprovider -rs tests/test_kernels_gpu.py tests/test_tensorrt_runtime_gpu.py \
  tests/test_attention_torch.py ${EXTRA_TESTS:-} 2>&1 | tee "$OUT/pytest_gpu.log" | tail -15
python3 benchmarks/gpu_heat_load.py --seconds 70 --on 15 --off 15 >"$OUT/heat.log" 2>&1 &
python3 -m edgeattn.cli.main thermal record --source nvml --seconds 62 --out "$OUT/trace.csv"
wait
python3 -m edgeattn.cli.main thermal fit "$OUT/trace.csv" --json | tee "$OUT/fit.json"
