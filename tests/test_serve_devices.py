"""`edgeattn serve BUNDLE --devices`: one engine per GPU behind one model name, on a CPU.

The GPUs are stand-ins: torch.cuda's answers replaced (cuda_fakes.py) where the device list is checked, and each
"GPU" engine opened on CPU tensors (`engine_device` gives "cpu"), so two engines of the tiny cuda bundle serve
real HTTP requests. What needs several real GPUs (throughput, NCCL) is not run here (docs/verification.md)."""

from __future__ import annotations

import json
import shutil
import threading

import pytest

pytest.importorskip("aiohttp")

from cuda_fakes import pretend_gpu  # noqa: E402
from decoder_fixtures import requires_decoder_stack  # noqa: E402
from serve_support import http, metric_value, post_json, sse, tiny_bundle, wait_ready_http  # noqa: E402

pytestmark = requires_decoder_stack
PROMPTS = ["The capital of France", "Once upon a time", "def fibonacci(n):", "Heat flows from", "1, 2, 3,",
           "A haiku about rain", "Hello there", "Matrix multiplication"]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from decoder_fixtures import tiny_llama

    from edgeattn.bundle.cuda_build import CudaBuildConfig, build_cuda

    model, tok = tiny_llama()
    folder = tmp_path_factory.mktemp("cuda_devices")
    model.save_pretrained(folder / "hf")
    tok.save_pretrained(folder / "hf")
    return build_cuda(folder / "hf", CudaBuildConfig(out=folder / "tiny.cuda", precision="fp32", window_max=48,
                                                     archs=(), name="tiny"))


@pytest.fixture
def cpu_engines(monkeypatch):
    """Every GPU's engine opens on CPU tensors."""
    from edgeattn.runtime.cuda import devices

    monkeypatch.setattr(devices, "engine_device", lambda index: "cpu")


def _gpus(monkeypatch, *kinds: tuple[str, int]) -> None:
    """torch.cuda says these GPUs (name, sm) are there, numbered in order."""
    import torch

    pretend_gpu(monkeypatch, sm=kinds[0][1], name=kinds[0][0])

    def index(device=None):
        return 0 if device is None else device if isinstance(device, int) else (torch.device(device).index or 0)

    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(kinds))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: kinds[index(device)][0])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: divmod(kinds[index(device)][1], 10))


def _serve(runner, monkeypatch, *args):
    from edgeattn.cli.main import cli
    from edgeattn.runtime.server import runner as server_runner

    served = []
    monkeypatch.setattr(server_runner, "serve_forever", lambda app, *a, **k: served.append(app))
    return runner.invoke(cli, ["serve", *map(str, args), "--port", "0"]), served


def _built_for(bundle, tmp_path, archs: list[int]):
    copy = tmp_path / "for_arch.cuda"
    shutil.copytree(bundle.path, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["target"]["sm"] = archs
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


# --- the device list -------------------------------------------------------------------------------------------------
def test_the_device_list_is_all_or_indices_each_once():
    from edgeattn.errors import ConfigError
    from edgeattn.runtime.cuda.devices import parse_devices
    from edgeattn.runtime.server.settings import ServeSettings

    assert parse_devices("all") is None and parse_devices(" 1, 0 ") == (1, 0)
    with pytest.raises(ConfigError, match=r"expected each GPU once, found 1 more than once in '0,1,1'"):
        ServeSettings(devices="0,1,1")
    with pytest.raises(ConfigError, match=r"expected 'all' or GPU indices such as 0,1, found 'gpu0'"):
        ServeSettings.from_env({"EDGEATTN_SERVE_DEVICES": "gpu0"})
    assert ServeSettings().devices == "" and ServeSettings.from_env({"EDGEATTN_SERVE_DEVICES": "all"}).devices == "all"


def test_multicast_is_kept_off_unless_the_user_set_it():
    from edgeattn.runtime.cuda.devices import keep_multicast_off

    environ = {"NVSHMEM_DISABLE_NVLS": "0"}
    keep_multicast_off(environ)
    assert environ == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "0"}


def _no_multicast_settings(monkeypatch) -> None:
    """The multicast variables unset for this test, and as they were afterwards."""
    from edgeattn.runtime.cuda.devices import NO_MULTICAST

    for name in NO_MULTICAST:
        monkeypatch.setenv(name, "")  # recorded, so the teardown restores the variable as it was
        monkeypatch.delenv(name)


def test_distributed_training_keeps_multicast_off(monkeypatch):
    import os

    from edgeattn.quantize.distillation import init_distributed

    _no_multicast_settings(monkeypatch)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert init_distributed() == (0, 1)
    assert os.environ["NCCL_NVLS_ENABLE"] == "0" and os.environ["NVSHMEM_DISABLE_NVLS"] == "1"


def test_serve_devices_on_fake_gpus_starts_one_engine_per_gpu_and_says_so(bundle, runner, monkeypatch, cpu_engines):
    _no_multicast_settings(monkeypatch)
    _gpus(monkeypatch, ("NVIDIA H200", 90), ("NVIDIA H200", 90))
    result, served = _serve(runner, monkeypatch, bundle.path, "--devices", "all", "--slots", "3")
    assert result.exit_code == 0 and len(served) == 1, result.output
    assert "generation slots of tiny on cuda:0: 3 slots" in result.output
    assert "generation slots of tiny on cuda:1: 3 slots" in result.output
    import os

    assert os.environ["NCCL_NVLS_ENABLE"] == "0"
    from edgeattn.runtime.server.app import DECODERS

    group = served[0][DECODERS]["tiny"]
    assert [e.device for e in group.engines] == ["cuda:0", "cuda:1"] and group.slots == 6


@pytest.mark.parametrize("devices, message", [
    ("0,5", "--devices: expected GPU indices 0..1 (2 GPUs here), found 5"),
    ("1,1", "expected each GPU once, found 1 more than once in '1,1'"),
])
def test_bad_device_lists_are_refused_with_exit_code_2(bundle, runner, monkeypatch, devices, message):
    _gpus(monkeypatch, ("NVIDIA H200", 90), ("NVIDIA H200", 90))
    result, served = _serve(runner, monkeypatch, bundle.path, "--devices", devices)
    assert result.exit_code == 2 and not served, result.output
    assert message in result.output and "Traceback" not in result.output


def test_gpus_of_two_architectures_for_a_bundle_built_for_one_are_named(bundle, runner, monkeypatch, tmp_path):
    _gpus(monkeypatch, ("NVIDIA H200", 90), ("NVIDIA A100-SXM4-80GB", 80))
    result, served = _serve(runner, monkeypatch, _built_for(bundle, tmp_path, [90]), "--devices", "all")
    assert result.exit_code == 2 and not served, result.output
    assert ("found GPUs of several architectures: cuda:0 NVIDIA H200 (sm_90), cuda:1 NVIDIA A100-SXM4-80GB (sm_80); "
            "rebuild with --arch sm_80,sm_90") in result.output


def test_devices_without_gpus_or_with_a_bundle_that_is_not_cuda_are_refused(bundle, runner, monkeypatch, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result, served = _serve(runner, monkeypatch, bundle.path, "--devices", "all")
    assert result.exit_code == 2 and not served, result.output
    assert "--devices all: expected NVIDIA GPUs and PyTorch with CUDA, found torch" in result.output
    onnx_bundle = tiny_bundle(tmp_path / "enc")
    result, served = _serve(runner, monkeypatch, onnx_bundle.path, "--devices", "0")
    assert result.exit_code == 2 and not served, result.output
    assert "--devices: expected cuda bundles (one engine per GPU), found" in result.output


# --- serving on two engines ------------------------------------------------------------------------------------------
@pytest.fixture
def two_engines(bundle, cpu_engines):
    """A real server with the tiny cuda bundle on two stand-in GPUs, 2 slots each: (url, group, submitted)."""
    from edgeattn.runtime.server.app import DECODERS, create_app
    from edgeattn.runtime.server.runner import BackgroundServer
    from edgeattn.runtime.server.settings import ServeSettings

    settings = ServeSettings(port=0, warmup_runs=0, max_queue_delay_ms=0, prefill_chunk=16, slots=2, devices="0,1")
    app = create_app([bundle], settings, names=["tiny"], sensors=False, devices=(0, 1))
    group = app[DECODERS]["tiny"]
    submitted = {e.device: 0 for e in group.engines}
    for engine in group.engines:
        def counting(*a, _engine=engine, _submit=engine.submit, **k):
            submitted[_engine.device] += 1
            return _submit(*a, **k)
        engine.submit = counting
    with BackgroundServer(app) as url:
        wait_ready_http(url)
        yield url, group, submitted


def _metrics(url) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://{url}/metrics", timeout=30) as response:
        return response.read().decode()


def _stream(url, prompt):
    status, events, raw = sse(url, "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 10,
                                                       "temperature": 0, "stream": True})
    assert status == 200, raw
    return "".join(e["choices"][0]["text"] for e in events if e != "[DONE]" and e.get("choices"))


def test_concurrent_streams_spread_over_both_engines_and_each_equals_it_alone(two_engines):
    url, group, submitted = two_engines
    alone = [_stream(url, p) for p in PROMPTS]  # one at a time: always the first engine (ties: lowest index)
    assert submitted == {"cuda:0": len(PROMPTS), "cuda:1": 0}
    together: dict[int, str] = {}

    def one(i):
        together[i] = _stream(url, PROMPTS[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [together.get(i) for i in range(len(PROMPTS))] == alone
    assert submitted["cuda:1"] >= 1, submitted  # the second engine got work
    status, doc, _ = http(url, "GET", "/v2/health/ready")
    assert status == 200 and doc["ready"]


def test_the_group_answers_per_device_metrics_statistics_and_metadata(two_engines):
    url, group, _ = two_engines
    status, doc, _ = post_json(url, "/v1/completions", {"model": "tiny", "prompt": "Heat", "max_tokens": 3,
                                                         "temperature": 0})
    assert status == 200 and doc["usage"]["completion_tokens"] >= 1, doc
    text = _metrics(url)
    for device in ("cuda:0", "cuda:1"):
        assert metric_value(text, "edgeattn_device_slots", f'device="{device}",model="tiny"') == 2.0
        assert metric_value(text, "edgeattn_device_requests_running", f'device="{device}",model="tiny"') == 0.0
    assert metric_value(text, "edgeattn_slots", 'model="tiny"') == 4.0
    assert metric_value(text, "edgeattn_requests_running", 'model="tiny"') == 0.0
    status, doc, _ = http(url, "GET", "/v2/models/tiny/stats")
    stats = doc["model_stats"][0]
    assert stats["slots"] == 4 and [d["device"] for d in stats["devices"]] == ["cuda:0", "cuda:1"]
    status, doc, _ = http(url, "GET", "/v2/models/tiny")
    assert doc["parameters"]["slots"] == 4 and doc["parameters"]["devices"] == ["cuda:0", "cuda:1"]


def test_the_most_free_slots_wins_and_ties_go_to_the_lowest_index():
    from types import SimpleNamespace

    from edgeattn.runtime.server.decoder_group import DecoderGroup

    engines = [SimpleNamespace(free_slots=f, device=f"cuda:{i}") for i, f in enumerate([1, 3, 3, -2])]
    group = DecoderGroup.__new__(DecoderGroup)
    group.engines = engines
    assert group.pick().device == "cuda:1"


def test_each_gpu_window_is_its_own_and_the_admin_window_reaches_them_all(bundle, cpu_engines):
    from edgeattn.runtime.live_window import LiveWindow
    from edgeattn.runtime.server.app import DECODERS, create_app
    from edgeattn.runtime.server.settings import ServeSettings

    shared, w0, w1 = LiveWindow(0, max_window=48), LiveWindow(0, max_window=48), LiveWindow(0, max_window=48)
    app = create_app([bundle], ServeSettings(port=0, warmup_runs=0, slots=1, devices="0,1"), names=["tiny"],
                     window=shared, sensors=False, devices=(0, 1), device_windows=[w0, w1])
    engines = app[DECODERS]["tiny"].engines
    assert [e.live_window for e in engines] == [w0, w1]
    w1.set(12, source="controller")  # GPU 1 heats up: its window alone narrows
    assert (w0.get(), w1.get()) == (0, 12)
    shared.set(24, source="admin")
    assert (w0.get(), w1.get()) == (24, 24)


def test_a_controller_group_merges_the_gpus_readings():
    from thermal_fakes import fake_pynvml

    from edgeattn.runtime.live_window import LiveWindow
    from edgeattn.runtime.thermal.controller import ThermalController
    from edgeattn.runtime.thermal.policies import StepPolicy
    from edgeattn.runtime.thermal.sensors.nvml import NvmlSensor
    from edgeattn.runtime.thermal.service import ControllerGroup

    policy = StepPolicy(levels=(1.0, 0.5), thresholds_c=(75.0,), hysteresis_c=3.0, min_hold_s=0.0)
    windows = [LiveWindow(0, max_window=48), LiveWindow(0, max_window=48)]
    controllers = [ThermalController(NvmlSensor(i, nvml=fake_pynvml([t])), policy, w, 48)
                   for i, (t, w) in enumerate(zip([60, 80], windows))]
    for c in controllers:
        c.step()
    snap = ControllerGroup(controllers).metrics_snapshot()
    assert snap["zone_temps_c"] == {"gpu0": 60.0, "gpu1": 80.0} and snap["temp_c"] == 80.0
    assert snap["power_w"] == pytest.approx(500.0)
    assert [w.get() for w in windows] == [0, 24]  # the hot GPU's window alone


def test_serve_devices_with_a_thermal_policy_reads_each_gpu_through_nvml(bundle, runner, monkeypatch, tmp_path,
                                                                       cpu_engines):
    """A controller per GPU, reading NVML at that GPU's index there (CUDA_VISIBLE_DEVICES maps it without
    NVML's UUIDs), each moving its own GPU's window."""
    import sys

    from thermal_fakes import fake_pynvml

    from edgeattn.runtime.server.app import CONTROLLER, DECODERS, WINDOW

    _gpus(monkeypatch, ("NVIDIA H200", 90), ("NVIDIA H200", 90))
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([60]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    policy = tmp_path / "step.toml"
    policy.write_text('kind = "step"\nthresholds_c = [75, 85]\n')
    result, served = _serve(runner, monkeypatch, bundle.path, "--devices", "0,1", "--slots", "1",
                            "--thermal-policy", policy, "--thermal-sensor", "nvml")
    assert result.exit_code == 0 and len(served) == 1, result.output
    app = served[0]
    controllers = app[CONTROLLER].controllers
    assert [c.sensor.zone for c in controllers] == ["gpu2", "gpu3"]
    windows = [e.live_window for e in app[DECODERS]["tiny"].engines]
    assert [c.window for c in controllers] == windows and app[WINDOW] not in windows


def test_an_engine_s_calls_run_with_its_gpu_current(monkeypatch):
    """The current device is per thread and starts at GPU 0; Triton launches and CUDA graph captures use it, so
    every call into GPU 1's decoder (from the scheduler's thread, or warm-up on a pool thread) makes GPU 1 current."""
    import contextlib

    import torch

    from edgeattn.runtime.cuda.devices import OnDevice

    current = ["cuda:0"]

    @contextlib.contextmanager
    def device(dev):
        before, current[0] = current[0], str(dev)
        yield
        current[0] = before

    monkeypatch.setattr(torch.cuda, "device", device)

    class Decoder:
        layout, eos = "the layout", {2}

        def step(self, cache, streams):
            return current[0], cache, streams

    model = OnDevice(Decoder(), torch.device("cuda:1"))
    assert model.step("cache", [0]) == ("cuda:1", "cache", [0]) and current == ["cuda:0"]
    seen = []
    worker = threading.Thread(target=lambda: seen.append(model.step("c", [1])))
    worker.start()
    worker.join()
    assert seen == [("cuda:1", "c", [1])]
    model.eos = set()  # attributes reach the decoder itself
    assert model.layout == "the layout" and model._model.eos == set()
