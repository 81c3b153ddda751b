#!/usr/bin/env bash
# On a lent GPU machine (no internet; torch, triton, transformers there): the cuda target end to end with
# SmolLM2-135M's configuration and tokenizer (carried in .gpu_tok/, no weights) and random bf16 weights:
# build --target cuda, generate, then serve under concurrent load (benchmarks/serve_generate.py).
#   STREAMS=1024 bash scripts/h200_serve_cuda.sh          (results and logs in $OUT)
#   PRECISION=fp32 STREAMS=1024 CONCURRENCY=1024 bash scripts/h200_serve_cuda.sh
# PRECISION: the bundle's (bf16 by default; fp32 makes "equal to the request served alone" exact up to the
# matmul kernels a batch size picks). CONCURRENCY > 0 adds the batching run: one request at a time against
# CONCURRENCY concurrent streams (tokens/s, inter-token latency p50/p99 at the client).
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT=${OUT:-/tmp/out}; STREAMS=${STREAMS:-1024}; PRECISION=${PRECISION:-bf16}; CONCURRENCY=${CONCURRENCY:-0}; mkdir -p "$OUT" /tmp/pkg
rm -rf /tmp/pkg/* && cp -r edgeattn /tmp/pkg/ && cp -r runtime quantize plugins /tmp/pkg/edgeattn/
export PYTHONPATH=/tmp/pkg
python3 - <<'PY'
import shutil, torch, transformers
config = transformers.AutoConfig.from_pretrained(".gpu_tok")
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
with torch.no_grad():
    model.lm_head.weight.mul_(8.0) if model.lm_head.weight is not model.model.embed_tokens.weight else None
model.save_pretrained("/tmp/smol_random")
for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
    shutil.copy(f".gpu_tok/{f}", "/tmp/smol_random/")
print("random SmolLM2-shaped model saved")
PY
cd /tmp
timeout 180 python3 -m edgeattn.cli.main build /tmp/smol_random --target cuda --arch sm_90 --precision "$PRECISION" --out /tmp/smol.cuda 2>&1 | tail -3
timeout 120 python3 -m edgeattn.cli.main generate /tmp/smol.cuda --prompt "Explain what a heat sink does" --max-tokens 16 2>&1 | tail -3
# from /tmp: the server child runs `python -m edgeattn...`, which in the repository would find its edgeattn/ first
timeout ${SERVE_S:-330} python3 "$OLDPWD/benchmarks/serve_generate.py" --bundle /tmp/smol.cuda --streams "$STREAMS" \
  --slots "$STREAMS" --requests "$STREAMS" --short-tokens 16 --skip batching --skip steps 2>&1 | tee "$OUT/serve_cuda.log" | tail -5
if [ "$CONCURRENCY" -gt 0 ]; then
  timeout ${BATCH_S:-240} python3 "$OLDPWD/benchmarks/serve_generate.py" --bundle /tmp/smol.cuda --skip correctness \
    --skip steps --concurrency "$CONCURRENCY" --batch-tokens ${BATCH_TOKENS:-32} --batch-requests 1 --rounds 1 \
    --json "$OUT/serve_cuda_batching.json" 2>&1 | tee "$OUT/serve_cuda_batching.log" | tail -12
fi
