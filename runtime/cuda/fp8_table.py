"""Where FP8 beats bf16 for one linear layer: bf16 time / FP8 time (activation quantization included) of an
[M, K] x [K, N] product, per token count M (the largest bucket <= M applies) and (K, N) as "KxN".

Measured on the lent H200 by benchmarks/fp8_h200.py (`table` step; benchmarks/results/fp8_h200.json); fp8.choice
reads it. SmolLM2-135M's matrices (K or N = 576) never gain: the per-token quantization and a small K cost more
than the FP8 tensor cores save; from hidden 2,048 FP8 pays from about 1,024 tokens, from 4,096 at 64-256.
"""

TABLE = {
    "device": "NVIDIA H200 (sm_90)",
    "measured": "2026-12-02",
    "how": "CUDA graph replays of one product, bf16 F.linear vs quantize_rows_fp8 + torch._scaled_mm; torch 2.11, "
           "triton 3.6",
    "tokens": [1, 16, 64, 256, 1024, 4096, 16384],
    "speedup": {
        "576x960": [0.615, 0.542, 0.518, 0.514, 0.598, 0.766, 0.76],
        "576x576": [0.56, 0.519, 0.512, 0.496, 0.565, 0.522, 0.577],
        "576x3072": [0.551, 0.534, 0.557, 0.592, 0.761, 0.919, 0.988],
        "1536x576": [0.6, 0.553, 0.539, 0.526, 0.568, 0.645, 0.785],
        "2048x2048": [0.551, 0.552, 0.563, 0.611, 1.099, 1.173, 1.296],
        "4096x6144": [0.793, 0.704, 1.008, 1.3, 1.503, 1.562, 1.632],
        "4096x28672": [1.154, 1.187, 1.367, 1.591, 1.483, 1.682, 1.655],
        "14336x4096": [0.877, 0.824, 0.912, 1.158, 1.514, 1.681, 1.603],
    },
}
