"""The thermal controller inside the real service: a replayed hot trace shrinks the live window, and
responses and /metrics carry the temperature."""

from __future__ import annotations

import time
import urllib.request

import numpy as np
import pytest

tritonclient_http = pytest.importorskip("tritonclient.http")
pytest.importorskip("aiohttp")

from edgeattn.runtime.live_window import LiveWindow  # noqa: E402
from edgeattn.runtime.server.app import create_app  # noqa: E402
from edgeattn.runtime.server.runner import BackgroundServer  # noqa: E402
from edgeattn.runtime.thermal.service import thermal_controller  # noqa: E402
from serve_support import make_bundle, wait_ready, window_model  # noqa: E402


def test_hot_trace_shrinks_the_window_and_is_reported(tmp_path):
    bundle = make_bundle(tmp_path, window_model(), "win")
    trace = tmp_path / "hot.csv"
    trace.write_text("t,temp_c,power_w\n" + "".join(f"{i * 0.2:.1f},{90 + 0.1 * i:.1f},10\n" for i in range(50)))
    policy = tmp_path / "policy.toml"
    policy.write_text('kind = "step"\nlevels = [1.0, 0.5, 0.25]\nthresholds_c = [75, 85]\n'
                      "hysteresis_c = 3\nmin_hold_s = 0\n")
    live = LiveWindow(0)
    controller = thermal_controller(live, policy=policy, sensor=f"replay:{trace}", max_window=32, hz=5)
    app = create_app([bundle], window=live, controller=controller, sensors=False)
    with BackgroundServer(app) as url:
        client = tritonclient_http.InferenceServerClient(url)
        wait_ready(client)
        deadline = time.monotonic() + 10
        while live.get() != 8 and time.monotonic() < deadline:  # 90 C is above both thresholds: quarter
            time.sleep(0.05)
        assert live.get() == 8
        ids = tritonclient_http.InferInput("input_ids", [1, 4], "INT64")
        ids.set_data_from_numpy(np.arange(4, dtype=np.int64)[None])
        result = client.infer("win", [ids]).get_response()
        params = result["parameters"]
        assert params["attention_window"] == 8
        assert params["device_temp_c"] >= 90
        metrics = urllib.request.urlopen(f"http://{url}/metrics", timeout=5).read().decode()
        assert "edgeattn_attention_window 8.0" in metrics
        assert "edgeattn_device_temp_c" in metrics
    assert not controller.running
