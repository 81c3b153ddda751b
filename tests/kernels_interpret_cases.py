"""Runs the Triton kernels under TRITON_INTERPRET=1 on CPU tensors and prints one JSON line of errors.

Started as its own process by tests/test_kernels_interpret.py: the variable must be set before the
kernels are decorated, and the AOT tests in the main process need the real (compiling) Triton.
Checked against the float64 NumPy reference. fp16 only: Triton's interpreter computes bf16 dots wrongly.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402

from edgeattn.attention.reference import windowed_attention_np  # noqa: E402
from edgeattn.plugins.kernels import decode, dispatch, tuning  # noqa: E402

TILE = (16, 16, 4, 2)  # small tiles so that tiny shapes still cross several blocks

# name: (b, h, h_kv, s_q, s_k, d, window, sinks, causal, pad)
CASES = {
    "causal-window-sinks-gqa": (1, 4, 2, 37, 37, 16, 5, 2, True, False),
    "causal-full": (1, 2, 1, 41, 41, 32, 0, 0, True, False),
    "causal-window-over-length": (1, 2, 2, 19, 19, 16, 100, 0, True, False),
    "bidir-band-sinks": (1, 2, 2, 37, 37, 16, 4, 3, False, False),
    "bidir-sinks-beyond-band": (1, 1, 1, 40, 40, 16, 3, 25, False, False),
    "padding-empty-rows": (2, 2, 1, 33, 33, 16, 6, 2, True, True),
    "chunked-prefill": (1, 4, 1, 20, 53, 16, 9, 3, True, False),
    "decode-one": (2, 4, 2, 1, 53, 16, 7, 3, True, False),
    "decode-three-bidir-pad": (1, 4, 2, 3, 61, 16, 11, 2, False, True),
    "decode-full": (1, 4, 1, 2, 80, 32, 0, 0, True, False),
}


def run_case(name, path, **options) -> float:
    b, h, h_kv, s_q, s_k, d, window, sinks, causal, pad = CASES[name]
    gen = torch.Generator().manual_seed(hash(name) % 2**31)
    q = torch.randn(b, h, s_q, d, generator=gen).half()
    k = torch.randn(b, h_kv, s_k, d, generator=gen).half()
    v = torch.randn(b, h_kv, s_k, d, generator=gen).half()
    mask = None
    if pad:
        mask = torch.rand(b, s_k, generator=gen) > 0.3
        mask[0, : s_k // 2] = False  # early rows of batch 0 have no key at all -> zeros
    out = path(q, k, v, torch.tensor(window), sinks=sinks, causal=causal, key_padding_mask=mask, **options)
    ref = windowed_attention_np(q.numpy(), k.numpy(), v.numpy(), window, sinks=sinks, causal=causal,
                                key_padding_mask=None if mask is None else mask.numpy())
    if not np.isfinite(out.float().numpy()).all():
        return float("inf")
    return float(np.abs(out.float().numpy() - ref).max())


def main() -> None:
    errors = {}
    for name in CASES:
        errors[f"public:{name}"] = run_case(name, dispatch.windowed_attention)
        if CASES[name][3] > tuning.DECODE_MAX_QUERIES or name.startswith("chunked"):
            for tma in (False, True):
                for one in (False, True):
                    errors[f"prefill-tma{tma:d}-one{one:d}:{name}"] = run_case(
                        name, dispatch.windowed_prefill, tile=TILE, use_tma=tma, one_loop=one)
        else:
            for splits in (1, 4):
                errors[f"decode-splits{splits}:{name}"] = run_case(name, decode.windowed_decode, splits=splits)
            errors[f"prefill-kernel:{name}"] = run_case(name, dispatch.windowed_prefill, tile=TILE)
    # the same window tensor, changed in place: no new kernel, new result
    b, h, s, d = 1, 2, 30, 16
    q, k, v = (torch.randn(b, h, s, d).half() for _ in range(3))
    window = torch.tensor(4)
    first = dispatch.windowed_prefill(q, k, v, window, tile=TILE).float()
    window.fill_(12)
    second = dispatch.windowed_prefill(q, k, v, window, tile=TILE).float()
    ref = windowed_attention_np(q.numpy(), k.numpy(), v.numpy(), 12)
    errors["window-changed-in-place"] = float(np.abs(second.numpy() - ref).max())
    errors["window-change-moves-output"] = float((first - second).abs().max())
    json.dump(errors, sys.stdout)


if __name__ == "__main__":
    main()
