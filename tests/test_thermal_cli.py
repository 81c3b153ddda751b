"""`edgeattn thermal` end to end: record (fake NVML), fit --json, simulate (PNG + summary), tune, quality."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from PIL import Image

from edgeattn.cli.main import cli
from edgeattn.runtime.thermal.offline.simulated_device import RCModel
from thermal_fakes import fake_pynvml

STEP_75_85 = 'kind = "step"\nlevels = [1.0, 0.5, 0.25]\nthresholds_c = [75, 85]\nhysteresis_c = 3\nmin_hold_s = 10\n'


def test_record_nvml_writes_a_trace(runner, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([60, 61, 62, 63], power_mw=300_000))
    out = tmp_path / "trace.csv"
    res = runner.invoke(cli, ["thermal", "record", "--source", "nvml", "--seconds", "0.6", "--hz", "10",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    lines = out.read_text().splitlines()
    assert lines[0].split(",")[:5] == ["t", "temp_c", "power_w", "clock_mhz", "throttle"]
    assert "temp_gpu0" in lines[0] and len(lines) >= 5
    assert lines[1].split(",")[1:3] == ["60.0", "300.0"]
    assert "trip point 87.0 C" in res.output


def test_fit_json_recovers_a_synthetic_trace(runner, tmp_path):
    rng = np.random.default_rng(0)
    t = np.arange(0, 1200, 1.0)
    power = np.where((t // 200) % 2 == 0, 300.0, 90.0)
    temp = RCModel(0.12, 400.0, 30.0).simulate(t, power, 40.0) + rng.normal(0, 0.25, len(t))
    path = tmp_path / "trace.csv"
    path.write_text("t,temp_c,power_w,clock_mhz\n" + "".join(f"{a},{b:.3f},{c},1980\n" for a, b, c in zip(t, temp, power)))
    res = runner.invoke(cli, ["thermal", "fit", str(path), "--json", "--out", str(tmp_path / "fit.json")])
    assert res.exit_code == 0, res.output
    fit = json.loads(res.output)
    assert set(fit) >= {"r_c_per_w", "c_j_per_c", "tau_s", "ambient_c", "rmse_c"}
    assert fit["r_c_per_w"] == pytest.approx(0.12, rel=0.1) and fit["c_j_per_c"] == pytest.approx(400, rel=0.1)
    assert json.loads((tmp_path / "fit.json").read_text()) == fit


def test_fit_bad_trace_is_a_one_line_error(runner, tmp_path):
    (tmp_path / "t.csv").write_text("t,temp_c,power_w\n0,50,10\n")
    res = runner.invoke(cli, ["thermal", "fit", str(tmp_path / "t.csv")])
    assert res.exit_code == 2 and "at least 20 rows" in res.output and "Traceback" not in res.output


@pytest.fixture
def fit_json(tmp_path):
    path = tmp_path / "fit.json"
    path.write_text(json.dumps({"r_c_per_w": 2.0, "c_j_per_c": 60.0, "tau_s": 120.0, "ambient_c": 25.0, "rmse_c": 0.3}))
    return path


def test_simulate_writes_summary_and_a_png(runner, tmp_path, fit_json):
    (tmp_path / "step.toml").write_text(STEP_75_85)
    out = tmp_path / "sim"
    res = runner.invoke(cli, ["thermal", "simulate", "--model", str(fit_json), "--policy", str(tmp_path / "step.toml"),
                              "--workload", "hot-ambient", "--out", str(out)])
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    assert {"max_temp_c", "trip_crossings", "mean_window_fraction", "window_changes_per_min"} <= set(summary)
    assert summary["trip_crossings"] == 0 and summary["max_temp_c"] < 99.0
    with Image.open(out / "simulation.png") as img:
        img.verify()
    with Image.open(out / "simulation.png") as img:
        assert img.format == "PNG" and img.size == (1000, 750)


def test_crossing_the_trip_point_shows_as_latency_collapse(runner, tmp_path, fit_json):
    (tmp_path / "late.toml").write_text('kind = "step"\nlevels = [1.0, 0.5]\nthresholds_c = [110]\n')
    out = tmp_path / "sim"
    res = runner.invoke(cli, ["thermal", "simulate", "--model", str(fit_json), "--policy", str(tmp_path / "late.toml"),
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trip_crossings"] >= 1 and summary["throttled_s"] > 0
    lines = (out / "series.csv").read_text().splitlines()
    header = lines[0].split(",")
    rows = [dict(zip(header, map(float, line.split(",")))) for line in lines[1:]]
    hot = [r for r in rows if r["throttled"] == 1]
    # default device: 40 ms at full window, half of it attention; throttled clocks: 3x the latency
    assert hot and all(r["latency_ms"] == pytest.approx(3 * 40 * (0.5 + 0.5 * r["fraction"])) for r in hot)
    assert all(r["latency_ms"] == pytest.approx(40 * (0.5 + 0.5 * r["fraction"])) for r in rows if not r["throttled"])


def test_tuned_policy_beats_the_75_85_step_rule_on_hot_ambient(runner, tmp_path, fit_json):
    tuned = tmp_path / "tuned.toml"
    res = runner.invoke(cli, ["thermal", "tune", "--model", str(fit_json), "--quick", "--out", str(tuned)])
    assert res.exit_code == 0, res.output
    assert tuned.read_text().startswith("# tuned by edgeattn thermal tune") and 'kind = "predictive"' in tuned.read_text()
    (tmp_path / "step.toml").write_text(STEP_75_85)
    summaries = {}
    for name in ("tuned", "step"):
        out = tmp_path / f"sim_{name}"
        res = runner.invoke(cli, ["thermal", "simulate", "--model", str(fit_json), "--policy",
                                  str(tmp_path / f"{name}.toml"), "--seed", "7", "--out", str(out)])
        assert res.exit_code == 0, res.output
        summaries[name] = json.loads((out / "summary.json").read_text())
    assert summaries["tuned"]["trip_crossings"] == 0
    assert summaries["tuned"]["window_changes_per_min"] <= 2.0
    assert summaries["tuned"]["mean_window_fraction"] > summaries["step"]["mean_window_fraction"]


def test_quality_prints_the_shipped_table(runner):
    res = runner.invoke(cli, ["thermal", "quality"])
    assert res.exit_code == 0, res.output
    assert "smollm2: perplexity per window (4 sinks, max window 512)" in res.output
    assert "W256" in res.output and "W32" in res.output
