"""Run in its own process with TRITON_INTERPRET=1 (tests/test_fp8.py): the FP8-cache ring kernel
(plugins/kernels/ring_fp8.py) against a float64 reference over the dequantized cache, tiny shapes. Prints JSON."""

from __future__ import annotations

import json

import torch

from edgeattn.plugins.kernels.ring_fp8 import dequantize_cache, dequantize_with_sinks, ring_decode_fp8
from edgeattn.plugins.kernels.ring_ops import ring_attend

out = {}
torch.manual_seed(0)
b, h, h_kv, d = 2, 4, 2, 16
for sinks, wmax, window, positions in [(2, 40, 0, [5, 70]), (0, 33, 7, [1, 50])]:
    keys = torch.randn(b, h_kv, sinks + wmax, d) * torch.tensor([3.0, 0.5])[None, :, None, None]  # heads differ
    values = torch.randn_like(keys)
    k_scale = keys.abs().amax(dim=(0, 2, 3)) * 1.5 / 448
    v_scale = values.abs().amax(dim=(0, 2, 3)) * 1.5 / 448
    k8 = (keys / k_scale[None, :, None, None]).to(torch.float8_e4m3fn)
    v8 = (values / v_scale[None, :, None, None]).to(torch.float8_e4m3fn)
    q, qs = torch.randn(b, h, 1, d, dtype=torch.float16), torch.randn(b, h, 1, d, dtype=torch.float16)
    pos, win = torch.tensor(positions), torch.tensor(window)
    want = ring_attend(q[:, :, 0].double(), qs[:, :, 0].double(), dequantize_cache(k8, k_scale, torch.float64),
                       dequantize_cache(v8, v_scale, torch.float64), pos, win, sinks, 0.0, 0)
    for splits in (1, 2):  # one program a kv head (writes out), two (partials + the reduce kernel)
        got = ring_decode_fp8(q, qs, k8, v8, k_scale, v_scale, pos, win, sinks=sinks, splits=splits)
        out[f"{sinks}-{wmax}-{window}-{splits}"] = float((got[:, :, 0].double() - want).abs().max())
    if sinks:  # sink rows from float buffers (x / scale in bf16, a spare row after them), not the FP8 rows
        k_sink = (keys[:, :, :sinks + 1] / k_scale[None, :, None, None]).bfloat16()
        v_sink = (values[:, :, :sinks + 1] / v_scale[None, :, None, None]).bfloat16()
        want_s = ring_attend(q[:, :, 0].double(), qs[:, :, 0].double(),
                             dequantize_with_sinks(k8, k_scale, k_sink, sinks, torch.float64),
                             dequantize_with_sinks(v8, v_scale, v_sink, sinks, torch.float64), pos, win, sinks, 0.0, 0)
        for splits in (1, 2):
            got = ring_decode_fp8(q, qs, k8, v8, k_scale, v_scale, pos, win, sinks=sinks, splits=splits,
                                  k_sinks=k_sink, v_sinks=v_sink)
            out[f"{sinks}-{wmax}-{window}-{splits}-float-sinks"] = float((got[:, :, 0].double() - want_s).abs().max())
        out[f"{sinks}-{wmax}-{window}-float-sinks-moved"] = float((want_s - want).abs().max())
    # the scales matter: the same bytes read with scale 1 give another answer
    one = torch.ones(h_kv)
    other = ring_decode_fp8(q, qs, k8, v8, one, one, pos, win, sinks=sinks, splits=1)
    out[f"{sinks}-{wmax}-{window}-unscaled"] = float((other[:, :, 0].double() - want).abs().max())
print(json.dumps(out))
