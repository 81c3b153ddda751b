"""edgeattn export-triton: config.pbtxt parsed with the ModelConfig protobuf schema that tritonclient ships."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest

import trt_fixtures as fx
from edgeattn.bundle.build import BuildConfig, build
from edgeattn.bundle.folder import Bundle
from edgeattn.cli.main import cli
from edgeattn.errors import ConfigError, InputError
from edgeattn.tritonserver.repository import TritonConfig, export_triton, model_kind, render_config
from decoder_fixtures import requires_decoder_stack
from onnx_fixtures import has
from test_fusion_reasons import attention_graph

model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2",
                                       reason="needs tritonclient[grpc] (the ModelConfig schema)")
from google.protobuf import text_format  # noqa: E402


def _parse(path: Path):
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def test_cpu_bundle_batched_onnxruntime(tiny_onnx, tmp_path, runner):
    build(tiny_onnx, BuildConfig(target="cpu", batch=(1, 4, 16)))
    repo = tmp_path / "repo"
    result = runner.invoke(cli, ["export-triton", str(tiny_onnx.with_name("tiny.edgeattn")), "--repo", str(repo),
                                 "--preferred-batch", "4", "--preferred-batch", "8", "--queue-delay-us", "250"])
    assert result.exit_code == 0, result.output
    config = _parse(repo / "tiny" / "config.pbtxt")
    T = model_config_pb2.DataType
    assert config.name == "tiny" and config.platform == "onnxruntime_onnx" and config.max_batch_size == 16
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("input_ids", T.TYPE_INT64, [-1]), ("attention_mask", T.TYPE_INT64, [-1])]
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [("last_hidden_state", T.TYPE_FP32, [-1, 16])]
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8]
    assert config.dynamic_batching.max_queue_delay_microseconds == 250
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert (repo / "tiny" / "1" / "model.onnx").is_file()
    assert '"${TRITONSERVER:-tritonserver}" --model-repository' in (repo / "launch.sh").read_text()


def test_cpu_bundle_on_the_python_backend_carries_its_python_path(tiny_onnx, tmp_path, runner):
    build(tiny_onnx, BuildConfig(target="cpu", batch=(1, 4, 16)))
    repo, site = tmp_path / "repo", tmp_path / "site"
    result = runner.invoke(cli, ["export-triton", str(tiny_onnx.with_name("tiny.edgeattn")), "--repo", str(repo),
                                 "--cpu-backend", "python", "--python-path", str(site), "--python-path", "/opt/venv"])
    assert result.exit_code == 0, result.output
    config = _parse(repo / "tiny" / "config.pbtxt")
    assert config.backend == "python" and not config.platform and config.max_batch_size == 16
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert config.parameters["edgeattn_python_path"].string_value == f"{site}:/opt/venv"
    version = repo / "tiny" / "1"
    assert sorted(p.name for p in version.iterdir()) == ["bundle", "edgeattn_environment.py", "model.py"]
    assert (version / "bundle" / "manifest.json").is_file()
    from edgeattn.tritonserver.python_environment import folders
    assert folders((repo / "tiny" / "config.pbtxt").read_text()) == [str(site), "/opt/venv"]


def test_python_path_is_refused_for_models_that_have_no_python(tiny_onnx, tmp_path):
    build(tiny_onnx, BuildConfig(target="cpu"))
    with pytest.raises(InputError, match="for Python-backend models"):
        export_triton(tiny_onnx.with_name("tiny.edgeattn"), tmp_path / "repo", TritonConfig(python_path=("/x",)))
    with pytest.raises(ConfigError, match="python_path"):
        TritonConfig(cpu_backend="python", python_path=("/a:/b",))
    with pytest.raises(ConfigError, match="cpu_backend"):
        TritonConfig(cpu_backend="tensorflow")


def test_max_batch_above_the_bundle_range_is_refused(tiny_onnx, tmp_path):
    build(tiny_onnx, BuildConfig(target="cpu", batch=(1, 1, 4)))
    with pytest.raises(InputError, match="above the bundle's batch range"):
        export_triton(tiny_onnx.with_name("tiny.edgeattn"), tmp_path / "repo", TritonConfig(max_batch_size=8))
    assert not (tmp_path / "repo" / "tiny").exists()


@pytest.fixture
def windowed_bundle(tmp_path) -> Bundle:
    """A cpu bundle of one fused attention block: inputs x, attention_mask and the scalar attention_window."""
    path = tmp_path / "attn.onnx"
    onnx.save(attention_graph("padding"), str(path))
    bundle = build(path, BuildConfig(target="cpu", batch=(1, 4, 16), seq=(1, 8, 16)))
    assert bundle.manifest.input("window").dims == ()
    return bundle


def test_windowed_encoder_on_the_python_backend_batches_with_an_optional_window_input(windowed_bundle, tmp_path,
                                                                                       runner):
    repo = tmp_path / "repo"
    result = runner.invoke(cli, ["export-triton", str(windowed_bundle.path), "--repo", str(repo), "--cpu-backend",
                                 "python", "--window", "3"])
    assert result.exit_code == 0, result.output
    config = _parse(repo / "attn" / "config.pbtxt")
    assert config.max_batch_size == 16 and config.HasField("dynamic_batching")
    T = model_config_pb2.DataType
    assert [(i.name, i.data_type, list(i.dims), i.optional, i.HasField("reshape")) for i in config.input] == [
        ("x", T.TYPE_FP32, [-1, 16], False, False), ("attention_mask", T.TYPE_INT64, [-1], False, False),
        ("attention_window", T.TYPE_INT64, [1], True, False)]  # one value per row; Triton has no scalars
    assert config.parameters["edgeattn_window"].string_value == "3"
    assert "a batch runs each window apart" in (repo / "attn" / "config.pbtxt").read_text()


def test_windowed_encoder_on_onnxruntime_has_the_window_fixed_in_model_onnx(windowed_bundle, tmp_path):
    import onnxruntime as ort

    folder = export_triton(windowed_bundle.path, tmp_path / "repo", TritonConfig(window=2))
    config = _parse(folder / "config.pbtxt")
    assert config.platform == "onnxruntime_onnx" and config.max_batch_size == 16
    assert [i.name for i in config.input] == ["x", "attention_mask"]
    session = ort.InferenceSession(str(folder / "1" / "model.onnx"))
    assert [i.name for i in session.get_inputs()] == ["x", "attention_mask"]
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 12, 16)).astype(np.float32), "attention_mask": np.ones((2, 12), np.int64)}
    bundle_session = ort.InferenceSession(str(windowed_bundle.artifact))
    want = bundle_session.run(None, {**feeds, "attention_window": np.array(2)})[0]
    np.testing.assert_allclose(session.run(None, feeds)[0], want, rtol=0, atol=1e-6)
    assert not np.allclose(want, bundle_session.run(None, {**feeds, "attention_window": np.array(0)})[0])
    with pytest.raises(ConfigError, match="window"):
        TritonConfig(window=-1)


def test_engine_with_a_scalar_window_is_served_by_the_python_backend(windowed_bundle, tmp_path):
    # Triton's TensorRT backend cannot feed a scalar: the engine goes to the Python backend, as rtx engines do
    manifest = dataclasses.replace(windowed_bundle.manifest, backend="tensorrt")
    engine = Bundle(windowed_bundle.path, manifest)
    assert model_kind(engine, TritonConfig()) == "python"
    config = text_format.Parse(render_config(engine, TritonConfig(), "attn"), model_config_pb2.ModelConfig())
    assert config.backend == "python" and config.max_batch_size == 16
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    assert [i.name for i in config.input if i.optional] == ["attention_window"]


@pytest.fixture
def rtx_attention_bundle(tmp_path, monkeypatch) -> Bundle:
    if not has("tensorrt_rtx"):
        pytest.skip("needs tensorrt-rtx")
    monkeypatch.setenv("EDGEATTN_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "attn.onnx"
    onnx.save(fx.attention(), str(path))
    return build(path, BuildConfig(target="rtx", precision="fp16", seq=(1, 8, 32)))


@pytest.mark.rtx
def test_rtx_bundle_uses_the_python_backend_and_batches_with_the_window_as_an_optional_input(rtx_attention_bundle,
                                                                                            tmp_path):
    folder = export_triton(rtx_attention_bundle.path, tmp_path / "repo", TritonConfig(model_name="attn"))
    config = _parse(folder / "config.pbtxt")
    assert config.backend == "python" and config.max_batch_size > 0 and config.HasField("dynamic_batching")
    window = [i for i in config.input if i.name == "window"][0]
    assert list(window.dims) == [1] and window.optional and not window.HasField("reshape")
    x = [i for i in config.input if i.name == "x"][0]
    assert list(x.dims) == [-1, fx.HIDDEN]  # batching: the batch dim is Triton's
    assert (folder / "1" / "model.py").is_file() and (folder / "1" / "bundle" / "model.engine").is_file()


@pytest.mark.rtx
def test_tensorrt_bundle_is_a_plan_with_the_plugin_library(rtx_attention_bundle, tmp_path):
    # a tensorrt (orin/thor/h100) bundle differs from an rtx one only in its backend field here; without the
    # scalar window input (which Triton cannot feed an engine) it is a plan
    m = rtx_attention_bundle.manifest
    manifest = dataclasses.replace(m, backend="tensorrt", inputs=[s for s in m.inputs if s.role != "window"])
    text = render_config(Bundle(rtx_attention_bundle.path, manifest), TritonConfig(plugin_library=Path("libedgeattn.so")),
                         "attn")
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert config.platform == "tensorrt_plan"
    assert config.parameters["edgeattn_plugin_library"].string_value == "plugins/libedgeattn.so"
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    assert list(config.instance_group[0].profile) == ["0", "1"]  # seq 1:8:32 gave two profiles


def test_plugin_library_is_refused_for_non_tensorrt_bundles(tiny_onnx, tmp_path):
    build(tiny_onnx, BuildConfig(target="cpu"))
    lib = tmp_path / "libx.so"
    lib.write_bytes(b"\x7fELF")
    with pytest.raises(InputError, match="for tensorrt bundles"):
        export_triton(tiny_onnx.with_name("tiny.edgeattn"), tmp_path / "repo", TritonConfig(plugin_library=lib))


@requires_decoder_stack
def test_decoder_bundle_is_a_decoupled_python_model_with_text_tensors(tiny_decoder, tmp_path):  # noqa: F811
    _, _, _, bundle_path = tiny_decoder
    folder = export_triton(bundle_path, tmp_path / "repo", TritonConfig(model_name="dec", instances=2))
    config = _parse(folder / "config.pbtxt")
    T = model_config_pb2.DataType
    assert config.backend == "python" and config.max_batch_size == 0 and config.model_transaction_policy.decoupled
    assert [(i.name, i.data_type, list(i.dims), i.optional) for i in config.input][:2] == [
        ("text_input", T.TYPE_STRING, [1], False), ("max_tokens", T.TYPE_INT32, [1], True)]
    assert {i.name for i in config.input} == {"text_input", "max_tokens", "temperature", "top_p", "top_k", "seed",
                                              "window", "attention_budget", "stop"}
    assert [(o.name, o.data_type) for o in config.output] == [
        ("text_output", T.TYPE_STRING), ("token_ids", T.TYPE_INT64), ("window", T.TYPE_INT32),
        ("attention_budget", T.TYPE_INT32),
        ("finish_reason", T.TYPE_STRING)]
    assert config.instance_group[0].count == 2 and not config.HasField("dynamic_batching")
    assert "get_response_sender" in (folder / "1" / "model.py").read_text()  # the decoupled model
    assert (folder / "1" / "bundle" / "tokenizer.json").is_file()


def test_python_environment_puts_the_folders_first_in_order_with_their_pth_files(tmp_path, monkeypatch):
    import sys

    from edgeattn.tritonserver.python_environment import add

    first, second, extra = tmp_path / "numpy1", tmp_path / "site-packages", tmp_path / "editable"
    for folder in (first, second, extra):
        folder.mkdir()
    (second / "project.pth").write_text(f"{extra}\n")  # an editable install's path file
    monkeypatch.setattr(sys, "path", ["/usr/lib/python3.11", str(second)])  # already there: moved to the front
    add([str(first), str(second)])
    assert sys.path == [str(first), str(second), str(extra), "/usr/lib/python3.11"]
