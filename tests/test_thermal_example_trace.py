"""The shipped Orin-class example trace: generated from the RC model, it fits back to that model, and a
simulation on the fit shrinks the window under load while staying below the trip point (the H200 trace,
tens of degrees from its trip point, keeps the full window throughout)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgeattn.runtime.thermal.offline import example_trace
from edgeattn.runtime.thermal.offline.fit import fit_rc
from edgeattn.runtime.thermal.offline.simulate import simulate
from edgeattn.runtime.thermal.offline.workload import PRESETS
from edgeattn.runtime.thermal.policies import StepPolicy
from edgeattn.runtime.thermal.sensors.trace import read_trace, rows_to_csv

H200_TRACE = Path(__file__).parent / "data" / "h200_smi_trace.csv"


@pytest.fixture(scope="module")
def fitted():
    return fit_rc(read_trace(example_trace.path()))


def test_shipped_trace_is_the_generated_one():
    assert example_trace.path().read_text() == rows_to_csv(example_trace.generate())


def test_trace_heats_toward_the_trip_point_and_stays_below_it():
    temps = read_trace(example_trace.path())["temp_c"]
    assert 85.0 < temps.max() < example_trace.TRIP_C
    assert temps.min() < 55.0


def test_fit_gives_back_the_model(fitted):
    model = example_trace.ORIN_MODEL
    assert fitted.r_c_per_w == pytest.approx(model.r_c_per_w, rel=0.05)
    assert fitted.tau_s == pytest.approx(model.tau_s, rel=0.10)
    assert fitted.ambient_c == pytest.approx(model.ambient_c, abs=1.0)


def test_simulation_shrinks_the_window_and_keeps_below_the_trip_point(fitted):
    result = simulate(fitted.model, StepPolicy(), PRESETS["hot-ambient"])
    fraction, temp = result.series["fraction"], result.series["temp_c"]
    assert fraction.min() < 1.0 and fraction[0] == 1.0
    assert result.summary.trip_crossings == 0 and temp.max() < result.summary.trip_c
    # without the policy (the window held full) this device would pass its trip point
    held = simulate(fitted.model, StepPolicy(levels=(1.0,), thresholds_c=()), PRESETS["hot-ambient"])
    assert held.summary.trip_crossings > 0


def test_the_h200_trace_never_shrinks_the_window():
    result = simulate(fit_rc(read_trace(H200_TRACE)).model, StepPolicy(), PRESETS["hot-ambient"])
    assert np.all(result.series["fraction"] == 1.0)


def test_module_writes_the_trace(tmp_path):
    out = tmp_path / "trace.csv"
    example_trace.main(["--out", str(out)])
    assert out.read_text() == example_trace.path().read_text()
