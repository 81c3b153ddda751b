"""Run in its own process with TRITON_INTERPRET=1 (tests/test_generation_torch.py): the cached decode kernel
against the float64 reference (its split partials merged by a reduce kernel or by the last split program), and the
CUDA-path generator (kernels interpreted on the CPU) against Hugging Face
`generate`. Prints one JSON object."""

from __future__ import annotations

import json

import numpy as np
import torch

from decoder_fixtures import tiny_llama
from edgeattn.attention.cached_reference import cached_attention_np
from edgeattn.attention.cached_torch import write_ring_
from edgeattn.plugins.kernels.cached_decode import cached_decode
from edgeattn.runtime.generation.generator import GenerationConfig, Generator
from edgeattn.runtime.generation.torch_decoder import TorchDecoderModel

out = {}
torch.manual_seed(0)
for sinks, wmax, window, positions in [(2, 40, 0, [0, 5, 57]), (4, 40, 7, [3, 30, 100]), (0, 33, 0, [10, 1, 70])]:
    b, h, h_kv, d = 3, 6, 2, 16
    kc = torch.randn(b, h_kv, sinks + wmax, d, dtype=torch.float16)
    vc = torch.randn_like(kc)
    q, qs = torch.randn(b, h, 1, d, dtype=torch.float16), torch.randn(b, h, 1, d, dtype=torch.float16)
    k, v = torch.randn(b, h_kv, 1, d, dtype=torch.float16), torch.randn(b, h_kv, 1, d, dtype=torch.float16)
    pos = torch.tensor(positions, dtype=torch.int64)
    want = cached_attention_np(q.float(), qs.float(), k.float(), v.float(), kc.float(), vc.float(), pos.numpy(),
                               window, sinks=sinks)
    write_ring_(kc, vc, k, v, pos, sinks)
    for splits in (None, 1, 4):  # the split count from the ring; one split (no reduce kernel); forced 4
        got = cached_decode(q, qs, kc, vc, pos, torch.tensor(window), sinks=sinks, splits=splits)
        out[f"kernel:{sinks}-{wmax}-{window}-{splits}"] = float(np.abs(got.float().numpy() - want).max())
    # forced 4 splits merged by the last split program of each kv head (a counter left zeros for the next use)
    counter = torch.zeros(b * h_kv, dtype=torch.int32)
    got = cached_decode(q, qs, kc, vc, pos, torch.tensor(window), sinks=sinks, splits=4, counter=counter)
    out[f"kernel:{sinks}-{wmax}-{window}-4-merged"] = float(np.abs(got.float().numpy() - want).max())
    out[f"counter:{sinks}-{wmax}-{window}"] = counter.tolist()

model, tok = tiny_llama()
ids = tok("The window shrinks as the device heats up, and", add_special_tokens=False).input_ids
hf = model.generate(torch.tensor([ids]), max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)
gen = Generator(TorchDecoderModel(model, tok, sinks=4, window_max=48, cuda_graphs=False))
res = gen.generate(ids, GenerationConfig(max_tokens=16, prefill_chunk=5))
out["hf_tokens"] = hf[0, len(ids):].tolist()
out["our_tokens"] = res.tokens
print(json.dumps(out))
