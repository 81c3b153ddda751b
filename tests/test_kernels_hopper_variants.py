"""The sm_90 prefill kernel (prefill_hopper.py; HopperVariant: host TMA descriptors, unmasked band loop, folded scale,
warp specialization) on CPU under TRITON_INTERPRET=1 against the float64 reference; the per-window table.

The interpreter runs host TensorDescriptor loads (with zero padding past a head's rows) but neither TMA
hardware nor warp specialization; those are timed and checked on the H200 (benchmarks/attention_h200.py
--sweep-hopper checks every candidate against the reference before timing it).
"""

from __future__ import annotations

import pytest

import interpreter_runs
from onnx_fixtures import has

pytestmark = [pytest.mark.triton, pytest.mark.skipif(not (has("triton") and has("torch")), reason="needs triton and torch")]


@pytest.fixture(scope="module")
def hopper_errors() -> dict[str, float]:
    return interpreter_runs.result("hopper_errors")


def test_every_variant_matches_the_reference(hopper_errors):
    bad = {k: v for k, v in hopper_errors.items() if k != "fallback-warned" and not v <= 2e-3}
    assert not bad, f"max abs error above 2e-3 (fp16): {bad}"


def test_every_variant_tile_and_case_ran(hopper_errors):
    variants = {k.split(":")[0] for k in hopper_errors}
    assert {"ptr", "desc", "ptr+fold+ls2", "desc+fold+ws", "desc+sink+split", "ptr+fold+sink+split",
            "desc+sink+split+one", "ptr+one"} <= variants
    assert sum(k.startswith("desc:32x16:") for k in hopper_errors) == 9  # BLOCK_M > BLOCK_N with descriptors
    assert sum(k.startswith("desc+sink+split:32x16:") for k in hopper_errors) == 9
    assert sum(k.startswith("desc+sink+split+one:32x16:") for k in hopper_errors) == 9


def test_misaligned_descriptors_fall_back_with_a_reason(hopper_errors):
    assert hopper_errors["fallback:misaligned"] <= 2e-3
    assert hopper_errors["fallback-warned"] == 1.0


def test_window_table_picks_by_window(monkeypatch):
    from edgeattn.errors import ConfigError
    from edgeattn.plugins.kernels import tuning

    monkeypatch.setattr(tuning, "PREFILL_WINDOW_TABLE", {
        (90, 128): [(512, (64, 64, 4, 3), {"desc": True}), (0, (128, 128, 8, 2), {"loop_stages": 3})],
    })
    assert tuning.prefill_config_for_window(90, 128, 256) == ((64, 64, 4, 3), tuning.HopperVariant(desc=True))
    assert tuning.prefill_config_for_window(90, 128, 0) == ((128, 128, 8, 2), tuning.HopperVariant(loop_stages=3))
    assert tuning.prefill_tile_for_window(90, 128, 4096) == (128, 128, 8, 2)
    assert tuning.prefill_config_for_window(90, 64, 256) == (tuning.prefill_tile(90, 64), None)  # no row: default
    assert tuning.prefill_config_for_window(87, 128, 256) == (tuning.prefill_tile(87, 128), None)
    with pytest.raises(ConfigError, match="loop_stages"):
        tuning.HopperVariant(loop_stages=0)
    assert tuning.HopperVariant(desc=True, fold_scale=True, loop_stages=3, warp_specialize=True).name == "desc+fold+ls3+ws"
    assert tuning.HopperVariant(desc=True, sink_block=True, split_edges=True).name == "desc+sink+split"


def test_sink_block_width():
    from edgeattn.plugins.kernels.prefill_hopper import sink_block_keys

    assert [sink_block_keys(s, 64) for s in (0, 1, 4, 16, 17, 33, 64, 65)] == [0, 16, 16, 16, 32, 64, 64, 0]
    assert sink_block_keys(20, 16) == 0  # more sinks than a block: they stay in the edge loop


def test_hopper_auto_keeps_the_default_kernel_off_cuda(monkeypatch):
    """hopper="auto" follows PREFILL_HOPPER on CUDA only; on CPU tensors (the interpreter) the default kernel
    runs, so the existing interpreter tests keep testing it. Checked by the launch that is chosen."""
    import torch

    from edgeattn.errors import InputError
    from edgeattn.plugins.kernels import dispatch, prefill, prefill_hopper, tuning

    launched = []
    monkeypatch.setattr(tuning, "PREFILL_HOPPER", {90: {"desc": True}})
    monkeypatch.setattr(prefill_hopper, "hopper_prefill", lambda *a, **kw: launched.append(kw["variant"]))

    class Stop(Exception):
        pass

    def no_default(*a, **kw):
        raise Stop

    monkeypatch.setattr(prefill._windowed_fwd_kernel, "run", no_default)
    q = torch.zeros(1, 1, 32, 16, dtype=torch.float16)
    w = torch.tensor(0)
    with pytest.raises(Stop):  # CPU tensors: auto -> the default kernel
        dispatch.windowed_prefill(q, q, q, w)
    dispatch.windowed_prefill(q, q, q, w, hopper={"fold_scale": True})  # explicit: the Hopper kernel
    monkeypatch.setattr(tuning, "PREFILL_WINDOW_TABLE", {(90, 64): [(0, (16, 16, 4, 2), {"desc": True})]})
    dispatch.windowed_prefill(q, q, q, w, window_hint=8)  # a table row picks the Hopper kernel
    assert launched == [tuning.HopperVariant(fold_scale=True), tuning.HopperVariant(desc=True)]
    with pytest.raises(InputError, match="hopper"):
        dispatch.windowed_prefill(q, q, q, w, hopper="fast")
