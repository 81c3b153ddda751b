"""Policies as pure functions, and policy files (TOML, YAML, JSON)."""

from __future__ import annotations

import math

import pytest

from edgeattn.errors import ConfigError, InputError
from edgeattn.runtime.thermal.policies import PolicyState, PredictivePolicy, StepPolicy
from edgeattn.runtime.thermal.policy_file import load_policy, policy_from_dict, save_policy
from edgeattn.runtime.thermal.readings import Reading
from edgeattn.runtime.thermal.offline.simulated_device import RCModel


def run(policy, temps, dt=1.0, power=20.0, trip=99.0):
    state, out = PolicyState(), []
    for k, temp in enumerate(temps):
        d = policy.decide(Reading(t=k * dt, temps={"z": temp}, power_w=power, trip_c=trip), state)
        state = d.state
        out.append(d.fraction)
    return out


def test_step_thresholds_hysteresis_and_hold():
    p = StepPolicy(thresholds_c=(75, 85), hysteresis_c=3, min_hold_s=10)
    temps = [70, 76, 86, 84, 83] + [81] * 12 + [71] * 12
    got = run(p, temps)
    assert got[:5] == [1.0, 0.5, 0.25, 0.25, 0.25]  # 84 and 83 are above 85 - 3 = 82: hold quarter
    assert got[5:12] == [0.25] * 7  # 81 < 82, but the 10 s hold since t=2 lasts until t=12
    assert got[12] == 0.5 and got[16] == 0.5  # below 82, above 72: half
    assert got[17:22] == [0.5] * 5 and got[22] == 1.0  # 71 < 72 once the hold from t=12 is over


def test_step_goes_to_smallest_at_trip_without_waiting():
    p = StepPolicy(thresholds_c=(90, 95), min_hold_s=1000)
    assert run(p, [70, 99.5]) == [1.0, 0.25]


def test_step_validates():
    with pytest.raises(ConfigError, match="thresholds_c"):
        StepPolicy(thresholds_c=(85, 75))
    with pytest.raises(ConfigError, match="levels"):
        StepPolicy(levels=(0.5, 1.0), thresholds_c=(80,))


def test_predictive_shrinks_when_the_rc_prediction_crosses_the_setpoint():
    # device: ambient 20 C, R 2 C/W, tau 100 s; idle steady state 60 C at 20 W, then 45 W (steady 110 C)
    p = PredictivePolicy(r_c_per_w=2.0, tau_s=100.0, levels=(1.0, 0.5), margin_c=4.0, horizon_s=50.0,
                         idle_w=10.0, attention_share=1.0)
    model = RCModel(2.0, 50.0, 20.0)
    state = p.decide(Reading(t=0.0, temps={"z": 60.0}, power_w=20.0, trip_c=99.0), PolicyState()).state
    assert state.ambient_hat_c == pytest.approx(20.0)
    temp, power, shrink_at = 60.0, 20.0, None
    for k in range(1, 200):
        temp, power = model.step(temp, power, 1.0), 45.0
        d = p.decide(Reading(t=float(k), temps={"z": temp}, power_w=power, trip_c=99.0), state)
        state = d.state
        if d.fraction == 0.5:
            shrink_at = k
            break
    # the exact RC prediction 50 s ahead at 45 W first exceeds the setpoint 95 C at this sample
    temp, want = 60.0, None
    for k in range(1, 200):
        temp = model.step(temp, 20.0 if k == 1 else 45.0, 1.0)
        if 110.0 + (temp - 110.0) * math.exp(-0.5) > 95.0:
            want = k
            break
    assert shrink_at == want and temp < 95.0
    assert d.time_to_trip_s == pytest.approx(100.0 * math.log((110.0 - temp) / (110.0 - 99.0)), rel=1e-6)


def test_predictive_integral_is_clamped_and_frozen_at_the_smallest_level():
    p = PredictivePolicy(r_c_per_w=1.0, tau_s=50.0, levels=(1.0, 0.5), margin_c=5.0, ki=1.0, integral_max_c=3.0)
    state = PolicyState()
    for k in range(5):  # above the setpoint (94) but below the emergency point (98)
        state = p.decide(Reading(t=float(k), temps={"z": 96.0}, power_w=10.0, trip_c=99.0), state).state
    assert state.level == 1 and state.integral_c <= 3.0
    frozen = state.integral_c
    state = p.decide(Reading(t=10.0, temps={"z": 97.0}, power_w=10.0, trip_c=99.0), state).state
    assert state.integral_c == frozen  # anti-windup at the smallest level


def test_policy_files_in_three_formats(tmp_path):
    (tmp_path / "p.toml").write_text('[policy]\nkind = "step"\nlevels = [1.0, 0.5]\nthresholds_c = [80]\n')
    (tmp_path / "p.yaml").write_text("kind: step\nlevels: [1.0, 0.5]\nthresholds_c: [80]\n")
    (tmp_path / "p.json").write_text('{"kind": "step", "levels": [1.0, 0.5], "thresholds_c": [80]}')
    want = StepPolicy(levels=(1.0, 0.5), thresholds_c=(80.0,))
    for name in ("p.toml", "p.yaml", "p.json"):
        assert load_policy(tmp_path / name) == want
    tuned = PredictivePolicy(r_c_per_w=1.7, tau_s=130.0, margin_c=2.5)
    save_policy(tuned, tmp_path / "t.toml", comment="tuned")
    assert load_policy(tmp_path / "t.toml") == tuned


def test_policy_file_errors_say_what_was_expected(tmp_path):
    with pytest.raises(ConfigError, match="kind = one of step, predictive"):
        policy_from_dict({"kind": "pid"})
    with pytest.raises(ConfigError, match="unknown keys for a step policy: treshold"):
        policy_from_dict({"kind": "step", "treshold": 3})
    (tmp_path / "bad.toml").write_text("kind = \n")
    with pytest.raises(InputError, match="cannot parse"):
        load_policy(tmp_path / "bad.toml")
    with pytest.raises(InputError, match="expected a .toml"):
        (tmp_path / "p.ini").write_text("")
        load_policy(tmp_path / "p.ini")
