"""Bad configuration values end in one clear error, not a traceback or silence (issue 19, item 16):
policy files with a wrong type, a manifest shape range holding a string, `edgeattn serve --max-window 0`."""

from __future__ import annotations

import json
import math
import re

import pytest

from edgeattn.bundle.build import BuildConfig, build
from edgeattn.cli.main import cli
from edgeattn.errors import BundleError, ConfigError
from edgeattn.runtime.thermal.policies import PredictivePolicy, StepPolicy
from edgeattn.runtime.thermal.policy_file import load_policy


@pytest.mark.parametrize("body, message", [
    ('thresholds_c = ["hot"]', r"thresholds_c: expected a list of numbers, found \['hot'\]"),
    ("levels = 5", "levels: expected a list of numbers, found 5"),
    ('hysteresis_c = "3"', "hysteresis_c: expected a number, found '3'"),
    ("min_hold_s = true", "min_hold_s: expected a number, found True"),
    ("thresholds_c = [75, nan]", r"thresholds_c: expected a list of numbers, found \[75, nan\]"),
])
def test_step_policy_file_with_a_wrong_type(tmp_path, body, message):
    path = tmp_path / "policy.toml"
    path.write_text(f'kind = "step"\n{body}\n')
    with pytest.raises(ConfigError, match=f"{path}: {message}"):
        load_policy(path)


def test_predictive_policy_file_with_a_wrong_type(tmp_path):
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"kind": "predictive", "r_c_per_w": "2", "tau_s": 100}))
    with pytest.raises(ConfigError, match="r_c_per_w: expected a number, found '2'"):
        load_policy(path)


def test_policies_made_in_code_check_types_too():
    with pytest.raises(ConfigError, match="thresholds_c: expected a list of numbers"):
        StepPolicy(thresholds_c=(75.0, "85"))
    with pytest.raises(ConfigError, match="horizon_s: expected a number, found inf"):
        PredictivePolicy(r_c_per_w=2.0, tau_s=100.0, horizon_s=math.inf)
    assert StepPolicy(levels=(1, 0.5), thresholds_c=(80,)).thresholds_c == (80,)  # ints are numbers


@pytest.fixture
def bundle(tiny_onnx):
    return build(tiny_onnx, BuildConfig(target="cpu", out=tiny_onnx.with_name("tiny.edgeattn")))


@pytest.mark.parametrize("bad, message", [
    (["1", 8, 32], "expected 3 integers min <= opt <= max, all >= 1, found \\['1', 8, 32\\]"),
    ([1, 8], "expected 3 integers min <= opt <= max, all >= 1, found \\[1, 8\\]"),
    ([8, 1, 32], "expected 3 integers min <= opt <= max, all >= 1, found \\[8, 1, 32\\]"),
    ("1:8:32", "expected 3 integers min <= opt <= max, all >= 1, found '1:8:32'"),
])
def test_manifest_shape_range_that_is_not_three_ordered_integers(bundle, runner, bad, message):
    path = bundle.path / "manifest.json"
    data = json.loads(path.read_text())
    dim = next(iter(data["shape_ranges"]))
    data["shape_ranges"][dim] = bad
    path.write_text(json.dumps(data))
    for command in (["bench", str(bundle.path), "--iterations", "1"], ["inspect", str(bundle.path)]):
        result = runner.invoke(cli, command)
        assert result.exit_code == BundleError.exit_code, result.output
        assert f"shape_ranges[{dim!r}]: {message.replace(chr(92), '')}" in result.output
        assert "Traceback" not in result.output


def test_serve_max_window_zero_is_refused(tmp_path, runner):
    policy = tmp_path / "policy.toml"
    policy.write_text('kind = "step"\n')
    for value in ("0", "-3"):
        result = runner.invoke(cli, ["serve", str(tmp_path / "any.edgeattn"), "--thermal-policy", str(policy),
                                     "--max-window", value])
        assert result.exit_code == 2, result.output
        assert "--max-window" in result.output
        assert f"expected a window of at least 1 token, found {value}" in result.output


def test_predictive_policy_file_without_its_model(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text('kind = "predictive"\ntau_s = 100\n')
    with pytest.raises(ConfigError, match="a predictive policy needs r_c_per_w, tau_s, found no r_c_per_w"):
        load_policy(path)


@pytest.mark.parametrize("name, text, found", [("p.json", "[1, 2]", "list '[1, 2]'"),
                                              ("p.toml", "policy = 5\n", "int '5'"),
                                              ("p.yaml", "just text\n", "str 'just text'")])
def test_policy_file_that_is_not_a_table_of_keys(tmp_path, name, text, found):
    if name.endswith(".yaml"):
        pytest.importorskip("yaml")
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError, match=f"expected keys .*, found {re.escape(found)}"):
        load_policy(tmp_path / name)
