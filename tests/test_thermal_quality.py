"""The window -> quality table, the attention function used to measure it, and a real H200 trace."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest

from edgeattn.runtime.thermal.offline.fit import fit_rc
from edgeattn.runtime.thermal.offline.quality import QualityTable, load_table
from edgeattn.runtime.thermal.sensors.trace import read_trace

DATA = Path(__file__).parent / "data"


def test_shipped_table_is_measured_smollm2_with_sinks():
    table = load_table()
    assert table.model == "smollm2" and table.metric == "perplexity" and table.sinks == 4
    assert set(table.windows) == {256, 128, 64, 32} and 25 < table.full < 40
    assert table.windows[32] > table.windows[64] > table.full  # small windows cost perplexity


def test_quality_interpolates_in_log_window():
    t = QualityTable("m", "perplexity", 512, 4, 30.0, {256: 30.0, 64: 40.0})
    assert t.quality(1.0) == 1.0 and t.quality(0.5) == 1.0
    assert t.quality(0.125) == pytest.approx(0.75)
    assert t.quality(0.25) == pytest.approx((1.0 + 0.75) / 2)  # log2(128) halfway between 64 and 256
    assert t.quality(0.01) == pytest.approx(0.75)  # below the smallest window: its value
    noisy = QualityTable("m", "perplexity", 512, 4, 30.0, {256: 31.0, 128: 30.5})
    assert noisy.quality(0.25) == pytest.approx(30 / 31)  # not better than the larger window
    cos = QualityTable("m", "cosine", 128, 4, 1.0, {64: 0.98})
    assert cos.quality(0.5) == pytest.approx(0.98)


@pytest.mark.torch
@pytest.mark.parametrize("window, sinks", [(0, 0), (3, 0), (3, 2), (5, 4)])
def test_measurement_attention_matches_the_op_reference(window, sinks):
    torch = pytest.importorskip("torch")
    from edgeattn.attention.hf_attention import WINDOW_KWARG, hf_attention_forward
    from edgeattn.attention.reference import windowed_attention_np

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 6, 11, 8, generator=g)  # q: [B, Hq, S, D]
    k = torch.randn(1, 2, 11, 8, generator=g)  # k: [B, Hkv, S, D] (GQA, 3 groups)
    v = torch.randn(1, 2, 11, 8, generator=g)
    module = types.SimpleNamespace(config=types.SimpleNamespace(edgeattn_sinks=sinks), is_causal=True)  # a Llama layer
    out, _ = hf_attention_forward(module, q, k, v, None, scaling=8 ** -0.5, **{WINDOW_KWARG: window})  # [B, S, Hq, D]
    want = windowed_attention_np(q.numpy(), k.numpy(), v.numpy(), window, sinks=sinks)  # [B, Hq, S, D]
    np.testing.assert_allclose(out.transpose(1, 2).numpy(), want, atol=1e-5)


def test_fit_accepts_a_real_h200_trace():
    # 180 s on the lent H200 (nvidia-smi at 2 Hz, bf16 matmuls 30 s on / 30 s off): 38-65 C, 80-694 W
    fit = fit_rc(read_trace(DATA / "h200_smi_trace.csv"))
    assert fit.r_c_per_w == pytest.approx(0.04, rel=0.15) and 30 < fit.ambient_c < 40
    assert any("below two sampling intervals" in n for n in fit.notes)  # the die follows power within a second
