"""The RC model against its closed form, and the fit on synthetic traces with known parameters."""

from __future__ import annotations

import numpy as np
import pytest

from edgeattn.errors import InputError
from edgeattn.runtime.thermal.offline.fit import fit_rc
from edgeattn.runtime.thermal.offline.simulated_device import RCModel
from edgeattn.runtime.thermal.sensors.trace import Trace, read_trace


def test_rc_step_matches_closed_form_float64():
    m = RCModel(r_c_per_w=1.5, c_j_per_c=80.0, ambient_c=30.0)
    t = np.linspace(0, 600, 601)
    got = m.simulate(t, np.full(601, 40.0), temp0_c=30.0)
    want = 30.0 + 60.0 * (1 - np.exp(-t / 120.0))
    assert np.max(np.abs(got - want)) < 1e-9


def synthetic(r, c, ambient, noise_c, seed, seconds=1800.0, dt=0.5):
    rng = np.random.default_rng(seed)
    t = np.arange(0, seconds, dt)
    power = np.where((t // 150) % 2 == 0, 35.0, 8.0) + rng.normal(0, 0.3, len(t))
    temp = RCModel(r, c, ambient).simulate(t, power, ambient + 10) + rng.normal(0, noise_c, len(t))
    return Trace({"t": t, "temp_c": temp, "power_w": power})


@pytest.mark.parametrize("r, c, ambient, noise", [(1.5, 80.0, 30.0, 0.3), (0.4, 500.0, 22.0, 0.5)])
def test_fit_recovers_r_and_c_within_10_percent(r, c, ambient, noise):
    fit = fit_rc(synthetic(r, c, ambient, noise, seed=3))
    assert abs(fit.r_c_per_w / r - 1) < 0.10 and abs(fit.c_j_per_c / c - 1) < 0.10
    assert abs(fit.ambient_c - ambient) < 1.0
    assert fit.rmse_c == pytest.approx(noise, rel=0.1)


def test_fit_rejects_constant_power_and_short_traces(tmp_path):
    trace = synthetic(1.0, 100.0, 25.0, 0.1, seed=0)
    flat = Trace({**trace.columns, "power_w": np.full(len(trace), 20.0)})
    with pytest.raises(InputError, match="power must change"):
        fit_rc(flat)
    with pytest.raises(InputError, match="at least 20 rows"):
        fit_rc(Trace({k: v[:5] for k, v in trace.columns.items()}))
    (tmp_path / "t.csv").write_text("time,temp\n0,1\n")
    with pytest.raises(InputError, match="missing t, temp_c, power_w"):
        read_trace(tmp_path / "t.csv")
