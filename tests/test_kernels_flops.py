"""The attended-pair count behind the benchmark's useful TFLOP/s agrees with the reference mask."""

from __future__ import annotations

import pytest

from edgeattn.attention.reference import allowed_mask_np
from onnx_fixtures import has

pytestmark = pytest.mark.skipif(not has("triton"), reason="needs triton")


@pytest.mark.parametrize("s_q,s_k,window,sinks,causal", [
    (4200, 4200, 0, 0, True), (4200, 4200, 256, 4, True), (4200, 4200, 1000, 0, False),
    (4200, 4200, 3, 2500, False), (100, 180000, 999, 7, True),
])
def test_formula_path_matches_the_mask(s_q, s_k, window, sinks, causal):
    from edgeattn.plugins.kernels.flops import attended_pairs

    assert s_q * s_k > 1 << 24  # large enough for the closed form, not the mask
    assert attended_pairs(s_q, s_k, window, sinks, causal) == int(allowed_mask_np(s_q, s_k, window, sinks, causal).sum())
