"""Exported repositories served by a real Triton Inference Server (the nvidia-pytriton wheel's `tritonserver`).

An encoder repository (cpu bundle, Python backend) answers tritonclient.http with the outputs of the runtime
backend that `edgeattn serve` runs; one whose bundle has the attention window input (fused attention) loads with
dynamic batching and answers each request with its own window, or the default without one; a decoder repository
streams, through /generate_stream, the tokens that `Generator.generate` gives for the same prompt. Every
repository's config, read back from /v2/models/{name}/config, keeps every field we wrote. The server's Python
gets numpy < 2 from `<venv>/tritonserver-site` (scripts/setup.sh puts it there) and edgeattn from this virtualenv.
"""

from __future__ import annotations

import ctypes.util
import json
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import pytest

from decoder_fixtures import SINKS, requires_decoder_stack
from edgeattn.bundle.build import BuildConfig, build
from edgeattn.bundle.folder import open_bundle
from edgeattn.runtime.backends import open_backend
from edgeattn.tritonserver.repository import TritonConfig, export_triton
from edgeattn.tritonserver.wheel_server import ServerPorts, WheelServer
from onnx_fixtures import requires_minilm, requires_torch
from test_fusion_reasons import attention_graph

SERVER = WheelServer.find()
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"  # the stub for this Python embeds the system libpython<PY>
STUB_SITE = Path(sys.prefix) / "tritonserver-site"  # numpy < 2 for the server's Python (scripts/setup.sh)
READY_S = 90

pytestmark = [
    pytest.mark.skipif(SERVER is None, reason="needs the nvidia-pytriton wheel (tritonserver; scripts/setup.sh "
                                              "installs it on Linux x86_64)"),
    pytest.mark.skipif(ctypes.util.find_library(f"python{PY}") is None,
                       reason=f"the Python-backend stub for {PY} needs the system libpython{PY} (libpython{PY} package)"),
    pytest.mark.skipif(not (STUB_SITE / "numpy").is_dir(), reason=f"needs numpy<2 in {STUB_SITE} for the server's "
                                                                   "Python (scripts/setup.sh puts it there)"),
]


def _python_path() -> tuple[str, ...]:
    return (str(STUB_SITE), sysconfig.get_paths()["purelib"])


@pytest.fixture
def serve(tmp_path):
    """serve(repo) -> a ready server on free loopback ports; stopped at teardown."""
    started = []

    def start(repo: Path):
        backends = SERVER.backends(tmp_path / "backends")
        server = SERVER.start(repo, backends, ServerPorts.free(), log=tmp_path / "tritonserver.log")
        started.append(server)
        server.wait_ready(READY_S)
        return server

    yield start
    for server in started:
        server.stop()
        assert server.process.returncode is not None


def assert_config_kept(written: Path, served: dict) -> None:
    """Every field config.pbtxt sets has the same value in the server's config (which adds its defaults)."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    ours = text_format.Parse(written.read_text(), model_config_pb2.ModelConfig())
    theirs = json_format.ParseDict(served, model_config_pb2.ModelConfig(), ignore_unknown_fields=True)
    _assert_subset(ours, theirs, "config")


def _assert_subset(ours, theirs, where: str) -> None:
    for field, value in ours.ListFields():
        got, here = getattr(theirs, field.name), f"{where}.{field.name}"
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            for key in value:
                assert key in got, f"{here}[{key!r}] was dropped by the server"
                if hasattr(value[key], "ListFields"):
                    _assert_subset(value[key], got[key], f"{here}[{key!r}]")
                else:
                    assert got[key] == value[key], here
        elif field.label == field.LABEL_REPEATED and field.message_type is not None:
            assert len(got) == len(value), f"{here}: wrote {len(value)}, served {len(got)}"
            for i, (mine, served) in enumerate(zip(value, got)):
                _assert_subset(mine, served, f"{here}[{i}]")
        elif field.message_type is not None:
            _assert_subset(value, got, here)
        else:
            assert list(got) == list(value) if field.label == field.LABEL_REPEATED else got == value, \
                f"{here}: wrote {value!r}, served {got!r}"


def test_encoder_repository_answers_tritonclient_like_the_runtime_backend(tiny_onnx, tmp_path, serve):
    httpclient = pytest.importorskip("tritonclient.http")
    bundle = build(tiny_onnx, BuildConfig(target="cpu", batch=(1, 4, 8), out=tmp_path / "tiny.edgeattn"))
    repo = tmp_path / "repo"
    export_triton(bundle.path, repo, TritonConfig(cpu_backend="python", python_path=_python_path()))
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 100, (3, 7), dtype=np.int64),
             "attention_mask": np.ones((3, 7), dtype=np.int64)}
    feeds["attention_mask"][1, 5:] = 0
    backend = open_backend(open_bundle(bundle.path))
    backend.activate()
    expected = backend.infer(feeds)["last_hidden_state"]
    backend.deactivate()

    server = serve(repo)
    client = httpclient.InferenceServerClient(server.url)
    inputs = []
    for name, value in feeds.items():
        tensor = httpclient.InferInput(name, list(value.shape), "INT64")
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    got = client.infer("tiny", inputs).as_numpy("last_hidden_state")
    assert got.shape == expected.shape == (3, 7, 16)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    assert not np.allclose(got[0], got[1])  # rows differ: the batch travelled as sent
    assert_config_kept(repo / "tiny" / "config.pbtxt", client.get_model_config("tiny"))


def _infer_inputs(httpclient, feeds: dict[str, np.ndarray], window: int | None) -> list:
    """tritonclient inputs for `feeds`, plus the window (one value per row) unless it is None."""
    if window is not None:
        rows = next(iter(feeds.values())).shape[0]
        feeds = {**feeds, "attention_window": np.full((rows, 1), window, np.int64)}
    inputs = []
    for name, value in feeds.items():
        tensor = httpclient.InferInput(name, list(value.shape), "FP32" if value.dtype == np.float32 else "INT64")
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def _direct(bundle, feeds: dict[str, np.ndarray], window: int) -> dict[str, np.ndarray]:
    """The bundle run through ONNX Runtime, as `edgeattn serve` runs it, with a scalar window."""
    with open_backend(open_bundle(bundle.path)) as backend:
        return backend.infer({**feeds, "attention_window": np.array(window, np.int64)})


def _windowed_requests(seed: int, rows: tuple[int, ...], seq: int = 12) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    requests = []
    for n in rows:
        mask = np.ones((n, seq), np.int64)
        mask[-1, seq - 3:] = 0  # padding in the last row
        requests.append({"x": rng.standard_normal((n, seq, 16)).astype(np.float32), "attention_mask": mask})
    return requests


def _settled_stats(client, model: str, tries: int = 50) -> dict:
    """The model's statistics once two reads 0.1 s apart agree (the server counts a request after answering)."""
    last = client.get_inference_statistics(model)["model_stats"][0]
    for _ in range(tries):
        time.sleep(0.1)
        now = client.get_inference_statistics(model)["model_stats"][0]
        if now["inference_count"] == last["inference_count"] and now["execution_count"] == last["execution_count"]:
            return now
        last = now
    return last


def test_windowed_encoder_repository_batches_and_follows_each_request_window(tmp_path, serve):
    httpclient = pytest.importorskip("tritonclient.http")
    path = tmp_path / "attn.onnx"
    onnx.save(attention_graph("padding"), str(path))  # one attention block: fused, so the window input exists
    bundle = build(path, BuildConfig(target="cpu", batch=(1, 4, 16), seq=(1, 8, 16), out=tmp_path / "attn.edgeattn"))
    assert bundle.manifest.input("window").name == "attention_window" and bundle.manifest.input("window").dims == ()
    repo = tmp_path / "repo"
    export_triton(bundle.path, repo, TritonConfig(model_name="attn", cpu_backend="python", python_path=_python_path(),
                                                  window=3, preferred_batch_sizes=(4,), max_queue_delay_us=2_000_000))
    requests = _windowed_requests(0, rows=(1, 2, 1, 2))
    windows = [None, 2, 5, 2]  # None: the default (3)
    expected = [_direct(bundle, feeds, 3 if w is None else w)["y"] for feeds, w in zip(requests, windows)]
    assert not np.allclose(expected[1], _direct(bundle, requests[1], 0)["y"])  # the window changes the answer

    server = serve(repo)
    client = httpclient.InferenceServerClient(server.url, concurrency=4)
    config = client.get_model_config("attn")
    assert_config_kept(repo / "attn" / "config.pbtxt", config)
    assert config["max_batch_size"] == 16 and config["dynamic_batching"]["preferred_batch_size"] == [4]
    for feeds, window, want in zip(requests, windows, expected):  # one at a time, with and without a window
        got = client.infer("attn", _infer_inputs(httpclient, feeds, window)).as_numpy("y")
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    # all at once: Triton batches the three that send a window (windows 2, 5, 2); the model runs each window apart
    pending = [client.async_infer("attn", _infer_inputs(httpclient, feeds, window))
               for feeds, window in zip(requests, windows)]
    for result, want in zip(pending, expected):
        np.testing.assert_allclose(result.get_result().as_numpy("y"), want, rtol=0, atol=1e-5)
    before = _settled_stats(client, "attn")  # the batch above may still be counted after its responses
    same = _windowed_requests(1, rows=(1, 1, 1, 1))  # one window, one shape: one batch of the preferred size
    pending = [client.async_infer("attn", _infer_inputs(httpclient, feeds, 2)) for feeds in same]
    for result, feeds in zip(pending, same):
        np.testing.assert_allclose(result.get_result().as_numpy("y"), _direct(bundle, feeds, 2)["y"], rtol=0, atol=1e-5)
    after = _settled_stats(client, "attn")
    assert after["inference_count"] - before["inference_count"] == 4
    assert after["execution_count"] - before["execution_count"] < 4  # batched, not one by one
    window = httpclient.InferInput("attention_window", [2, 1], "INT64")  # two rows, two windows: refused
    window.set_data_from_numpy(np.array([[1], [2]], np.int64))
    with pytest.raises(Exception, match="one window for the whole request"):
        client.infer("attn", _infer_inputs(httpclient, requests[1], None) + [window])
    client.close()


@pytest.mark.slow
@pytest.mark.long  # ~3 minutes: the quick start's export and build, then the real server
@requires_torch
@requires_minilm
def test_minilm_quick_start_repository_answers_like_onnx_runtime(tmp_path, serve, runner):
    """The quick start's bundle: `edgeattn export minilm`, `edgeattn build --target cpu`, `edgeattn export-triton
    --cpu-backend python`, queried with and without a window."""
    from edgeattn.cli.main import cli

    httpclient = pytest.importorskip("tritonclient.http")
    onnx_path, bundle_path, repo = tmp_path / "m.onnx", tmp_path / "m.edgeattn", tmp_path / "repo"
    for args in (["export", "minilm", "--out", str(onnx_path)],
                 ["build", str(onnx_path), "--target", "cpu", "--out", str(bundle_path)],
                 ["export-triton", str(bundle_path), "--repo", str(repo), "--cpu-backend", "python",
                  *[a for p in _python_path() for a in ("--python-path", p)]]):
        result = runner.invoke(cli, args)
        assert result.exit_code == 0, result.output
    bundle = open_bundle(bundle_path)
    name, output = bundle.manifest.name, bundle.manifest.outputs[0].name
    from edgeattn import hf_models

    _, tok, _ = hf_models.load("minilm")
    enc = tok(["edge devices run transformers", "a second, longer sentence to pad the batch of two"],
              padding=True, return_tensors="np")
    feeds = {spec.name: enc[spec.name].astype(np.int64) for spec in bundle.manifest.inputs if spec.role != "window"}
    server = serve(repo)
    client = httpclient.InferenceServerClient(server.url)
    assert_config_kept(repo / name / "config.pbtxt", client.get_model_config(name))
    for window in (None, 4, 0):
        got = client.infer(name, _infer_inputs(httpclient, feeds, window)).as_numpy(output)
        np.testing.assert_allclose(got, _direct(bundle, feeds, window or 0)[output], rtol=0, atol=1e-5)
    assert not np.allclose(_direct(bundle, feeds, 4)[output], _direct(bundle, feeds, 0)[output])
    client.close()


def _generate_stream(server, model: str, body: dict) -> list[dict]:
    """The server-sent events of one /generate_stream call; an error answer (HTTP 400) as its events too."""
    request = urllib.request.Request(f"http://{server.url}/v2/models/{model}/generate_stream",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read().decode("utf-8")
    except urllib.error.HTTPError as exc:
        assert exc.code == 400
        text = exc.read().decode("utf-8")
    events = [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: ")]
    return events or [json.loads(text)]


def _tokens(events: list[dict]) -> list[int]:
    """The generate extension writes a one-element tensor as a scalar, a longer one as a list."""
    return [t for e in events for t in (e["token_ids"] if isinstance(e["token_ids"], list) else [e["token_ids"]])]


@requires_decoder_stack
def test_decoder_repository_streams_the_generator_tokens(tiny_decoder, tmp_path, serve):  # noqa: F811
    from edgeattn.runtime.generation.generator import GenerationConfig, Generator
    from edgeattn.runtime.generation.sampling import SamplingConfig

    _, _, _, bundle_path = tiny_decoder
    repo = tmp_path / "repo"
    export_triton(bundle_path, repo, TritonConfig(model_name="dec", python_path=_python_path()))
    prompts = ["The weather in Lisbon today is", "Once upon a time"]
    with Generator.open(bundle_path) as generator:
        expected = [generator.generate(p, GenerationConfig(max_tokens=12)) for p in prompts]
        windowed = generator.generate(prompts[0], GenerationConfig(max_tokens=12, window=8))
        budgeted = generator.generate(prompts[0], GenerationConfig(max_tokens=12, budget=SINKS + 16))
        sampling = SamplingConfig(temperature=1.0, top_p=0.9, seed=7)
        sampled = generator.generate(prompts[1], GenerationConfig(max_tokens=16, sampling=sampling))
        assert len(set(sampled.tokens)) > 4 and len(sampled.text) > 12  # not one token repeated
        stop = sampled.text[8:11]
        stopped = generator.generate(prompts[1], GenerationConfig(max_tokens=16, sampling=sampling, stop=(stop,)))
    assert stopped.finish_reason == "stop" and len(stopped.tokens) < len(sampled.tokens)

    server = serve(repo)
    with urllib.request.urlopen(f"http://{server.url}/v2/models/dec/config", timeout=30) as response:
        assert_config_kept(repo / "dec" / "config.pbtxt", json.loads(response.read()))
    for body, message in (({"text_input": prompts[0], "window": 10_000}, "window: expected 0"),
                          ({"text_input": prompts[0], "max_tokens": 0}, "max_tokens: expected an integer >= 1"),
                          ({"text_input": ""}, "empty prompt"), ({"prompt": prompts[0]}, "text_input"),
                          ({"text_input": prompts[0], "attention_budget": SINKS + 32}, "retrieval pages"),
                          ({"text_input": prompts[0], "attention_budget": SINKS + 16, "window": 8},
                           "expected a window or a budget")):
        events = _generate_stream(server, "dec", body)  # each refused on its own; the model keeps serving
        assert len(events) == 1 and message in events[0]["error"], events
    for prompt, want in zip(prompts, expected):
        events = _generate_stream(server, "dec", {"text_input": prompt, "max_tokens": 12})
        assert len(events) >= 2  # streamed, not one answer
        assert _tokens(events) == want.tokens
        assert "".join(e["text_output"] for e in events) == want.text
        assert [e["finish_reason"] for e in events] == [""] * (len(events) - 1) + [want.finish_reason]
    events = _generate_stream(server, "dec", {"text_input": prompts[0], "max_tokens": 12, "window": 8})
    assert _tokens(events) == windowed.tokens
    assert {e["window"] for e in events} == {8} and {e["attention_budget"] for e in events} == {SINKS + 8}
    # a budget of sinks + 16 rows holds one page, all of it recent: the window of 16, reported as the budget
    events = _generate_stream(server, "dec", {"text_input": prompts[0], "max_tokens": 12,
                                              "attention_budget": SINKS + 16})
    assert _tokens(events) == budgeted.tokens and budgeted.budgets[-1] == SINKS + 16
    assert {e["attention_budget"] for e in events} == {SINKS + 16} and {e["window"] for e in events} == {16}
    events = _generate_stream(server, "dec", {"text_input": prompts[1], "max_tokens": 16, "temperature": 1.0,
                                              "top_p": 0.9, "seed": 7})
    assert _tokens(events) == sampled.tokens and "".join(e["text_output"] for e in events) == sampled.text
    events = _generate_stream(server, "dec", {"text_input": prompts[1], "max_tokens": 16, "temperature": 1.0,
                                              "top_p": 0.9, "seed": 7, "stop": [stop]})
    assert _tokens(events) == stopped.tokens and "".join(e["text_output"] for e in events) == stopped.text
    assert events[-1]["finish_reason"] == "stop"
    assert _grpc_stream_tokens(server, "dec", prompts[0], 12) == expected[0].tokens


def _grpc_stream_tokens(server, model: str, prompt: str, max_tokens: int) -> list[int]:
    """The same model through gRPC streaming (tritonclient.grpc): tokens until the response with a finish reason."""
    import queue

    grpcclient = pytest.importorskip("tritonclient.grpc")
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.ports.grpc}")
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
    limit = grpcclient.InferInput("max_tokens", [1], "INT32")
    limit.set_data_from_numpy(np.array([max_tokens], dtype=np.int32))
    client.async_stream_infer(model, [text, limit])
    tokens = []
    try:
        while True:
            result, error = results.get(timeout=60)
            assert error is None, error
            tokens += result.as_numpy("token_ids").tolist()
            if result.as_numpy("finish_reason")[0]:
                return tokens
    finally:
        client.stop_stream()
        client.close()
