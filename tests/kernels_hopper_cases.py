"""Runs the sm_90 prefill kernel (prefill_hopper.py, HopperVariant) under TRITON_INTERPRET=1 on CPU tensors and
prints one JSON object {case: max abs error} against the float64 NumPy reference.

Started as its own process by tests/test_kernels_hopper_variants.py (the variable must be set before
the kernels are decorated). fp16 only: Triton's interpreter computes bf16 dots wrongly. The interpreter
runs host TensorDescriptor loads (zero padding included) but not TMA hardware nor warp specialization:
`warp_specialize=True` is checked for its arithmetic only.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402

from edgeattn.attention.reference import windowed_attention_np  # noqa: E402
from edgeattn.plugins.kernels.dispatch import windowed_prefill  # noqa: E402
from edgeattn.plugins.kernels.tuning import HopperVariant  # noqa: E402

# name: (b, h, h_kv, s_q, s_k, d, window, sinks, causal, pad)
CASES = {
    "causal-window-sinks-gqa-odd": (1, 4, 2, 37, 37, 16, 5, 2, True, False),
    "causal-full-odd": (1, 2, 1, 41, 41, 32, 0, 0, True, False),
    "bidir-band-sinks": (1, 2, 2, 45, 45, 16, 7, 3, False, False),
    "bidir-full": (1, 2, 1, 33, 33, 16, 0, 0, False, False),
    "padding-empty-rows": (2, 2, 1, 33, 33, 16, 6, 2, True, True),
    "chunked-prefill": (1, 4, 1, 20, 53, 16, 9, 3, True, False),
    # wide windows: several unmasked band blocks per tile (with padding in the band), sinks over 1 block
    "padding-wide-window": (2, 2, 1, 70, 70, 16, 40, 2, True, True),
    "bidir-wide-window": (1, 2, 2, 70, 70, 16, 33, 3, False, False),
    "sinks-over-a-block": (1, 2, 1, 70, 70, 16, 9, 20, True, False),
}
VARIANTS = {
    "ptr": HopperVariant(),
    "desc": HopperVariant(desc=True),
    "ptr+fold+ls2": HopperVariant(fold_scale=True, loop_stages=2),
    "desc+fold+ws": HopperVariant(desc=True, fold_scale=True, warp_specialize=True),
    "desc+sink+split": HopperVariant(desc=True, sink_block=True, split_edges=True),
    "ptr+fold+sink+split": HopperVariant(fold_scale=True, sink_block=True, split_edges=True),
    "desc+sink+split+one": HopperVariant(desc=True, sink_block=True, split_edges=True, one_loop=True),
    "ptr+one": HopperVariant(one_loop=True),
    "desc+pers2": HopperVariant(desc=True, persistent=2),  # the persistent kernel (causal, no padding cases)
    "desc+pers3+edges": HopperVariant(desc=True, persistent=3, edge_masks=True),
    "desc+sink+rcp+tstore": HopperVariant(desc=True, sink_block=True, rcp_epilogue=True, tma_store=True),
}
TILES = {"16x16": (16, 16, 4, 2), "32x16": (32, 16, 4, 2)}  # BLOCK_M > BLOCK_N: diagonal spans two blocks


def run_case(name, **options) -> float:
    b, h, h_kv, s_q, s_k, d, window, sinks, causal, pad = CASES[name]
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    q = torch.randn(b, h, s_q, d, generator=gen).half()
    k = torch.randn(b, h_kv, s_k, d, generator=gen).half()
    v = torch.randn(b, h_kv, s_k, d, generator=gen).half()
    mask = None
    if pad:
        mask = torch.rand(b, s_k, generator=gen) > 0.3
        mask[0, : s_k // 2] = False  # early rows of batch 0 have no key at all -> zeros
    out = windowed_prefill(q, k, v, torch.tensor(window), sinks=sinks, causal=causal, key_padding_mask=mask,
                           **options)
    ref = windowed_attention_np(q.numpy(), k.numpy(), v.numpy(), window, sinks=sinks, causal=causal,
                                key_padding_mask=None if mask is None else mask.numpy())
    got = out.float().numpy()
    return float(np.abs(got - ref).max()) if np.isfinite(got).all() else float("inf")


def main() -> None:
    errors = {}
    for vname, variant in VARIANTS.items():
        for tname, tile in TILES.items():
            for name in CASES:
                if tname == "32x16" and vname not in ("ptr", "desc", "desc+sink+split", "desc+sink+split+one", "desc+pers2",
                                                      "desc+sink+rcp+tstore"):
                    continue  # keep the run short: the other variants share the tile logic
                errors[f"{vname}:{tname}:{name}"] = run_case(name, tile=tile, hopper=variant)
    # a misaligned view (row stride 9 halves = 18 bytes) falls back to plain loads and says why
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        q = torch.randn(1, 2, 20, 25).half()[..., :16]
        k = torch.randn(1, 2, 20, 16).half()
        v = torch.randn(1, 2, 20, 16).half()
        out = windowed_prefill(q, k, v, torch.tensor(4), tile=TILES["16x16"], hopper={"desc": True})
        ref = windowed_attention_np(q.numpy(), k.numpy(), v.numpy(), 4)
        errors["fallback:misaligned"] = float(np.abs(out.float().numpy() - ref).max())
    errors["fallback-warned"] = float(any("16 bytes" in str(w.message) for w in seen))
    json.dump(errors, sys.stdout)


if __name__ == "__main__":
    main()
