"""Target profiles are data: `auto` reads each target's GPU names, and no code tests a target's name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from edgeattn import targets
from edgeattn.targets import TARGETS, Target


@pytest.mark.parametrize("gpu, libraries, expected", [
    ("NVIDIA H200", {"tensorrt"}, "h100"),
    ("Orin (nvgpu)", {"tensorrt"}, "orin-agx"),
    ("NVIDIA Jetson Orin Nano", {"tensorrt"}, "orin-nano"),
    ("NVIDIA Thor", {"tensorrt"}, "thor"),
    ("NVIDIA A100-SXM4-80GB", {"tensorrt"}, "h100"),  # the data-center fallback
    ("NVIDIA GeForce RTX 4090", {"tensorrt_rtx"}, "rtx"),
    ("NVIDIA GeForce RTX 4090", set(), "cpu"),
    (None, {"tensorrt", "tensorrt_rtx"}, "cpu"),
])
def test_auto_picks_a_target_from_its_data(monkeypatch, gpu, libraries, expected):
    monkeypatch.setattr(targets, "detect_gpu", lambda: gpu)
    monkeypatch.setattr("edgeattn.optional.available", lambda name: name in libraries)
    target, why = targets.resolve_target("auto")
    assert target.name == expected, why


def test_targets_are_built_with_keywords():
    with pytest.raises(TypeError):
        Target("cpu", "x", "onnxruntime", (), ("fp32",))  # positional fields are refused
    assert TARGETS["h100"].hardware_compat == "SAME_COMPUTE_CAPABILITY" and TARGETS["rtx"].hardware_compat is None


def test_no_code_tests_a_target_by_its_name():
    root = Path(__file__).resolve().parents[1]
    names = "|".join(re.escape(n) for n in TARGETS)
    pattern = re.compile(rf"""\.name\s*(==|!=|in)\s*\(?["']({names})["']""")
    hits = [f"{p.relative_to(root)}:{i}" for folder in ("edgeattn", "quantize", "runtime", "plugins")
            for p in (root / folder).rglob("*.py")
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert hits == []
