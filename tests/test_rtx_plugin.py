"""The Python WindowedAttention plugin: registration, attribute fields, clone (no GPU needed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edgeattn.engines.tensorrt import adapter as tensorrt_adapter
from onnx_fixtures import has

pytestmark = [pytest.mark.rtx, pytest.mark.skipif(not has("tensorrt_rtx"), reason="needs tensorrt-rtx")]

CODE = r"""
import json, numpy as np, tensorrt_rtx as trt
from edgeattn.plugins.tensorrt.rtx import register, PLUGIN_NAME, PLUGIN_NAMESPACE, PLUGIN_VERSION
assert register(trt) and register(trt)  # idempotent
creator = trt.get_plugin_registry().get_creator(PLUGIN_NAME, PLUGIN_VERSION, PLUGIN_NAMESPACE)
fields = trt.PluginFieldCollection([
    trt.PluginField("causal", np.array([0], np.int32), trt.PluginFieldType.INT32),
    trt.PluginField("sinks", np.array([4], np.int32), trt.PluginFieldType.INT32),
    trt.PluginField("scale", np.array([0.125], np.float32), trt.PluginFieldType.FLOAT32)])
plugin = creator.create_plugin("attn0", fields, trt.TensorRTPhase.BUILD)
clone = plugin.clone()
out = {f.name: float(f.data[0]) for f in clone.get_fields_to_serialize()}
default = creator.create_plugin("attn1", trt.PluginFieldCollection([]), trt.TensorRTPhase.BUILD)
print(json.dumps({"fields": out, "names": [creator.name, creator.plugin_namespace, creator.plugin_version],
                  "default": [default.causal, default.sinks, default.scale], "outputs": plugin.num_outputs}))
"""


def test_plugin_fields_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEATTN_CACHE_DIR", str(tmp_path))
    fl = tensorrt_adapter.flavor("tensorrt_rtx")
    proc = subprocess.run([sys.executable, "-c", CODE], env=tensorrt_adapter.subprocess_env(fl),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["names"] == ["WindowedAttention", "edgeattn", "1"] and got["outputs"] == 1
    assert got["fields"] == {"causal": 0.0, "sinks": 4.0, "scale": 0.125}
    assert got["default"] == [1, 0, 0.0]  # docs/windowed-attention.md defaults
    assert (tmp_path / "lib").is_dir()  # the unversioned library link lives in the cache
