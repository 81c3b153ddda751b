"""Exported repositories served by a real Triton Inference Server (the nvidia-pytriton wheel's `tritonserver`).

An encoder repository (cpu bundle, Python backend) answers tritonclient.http with the outputs of the runtime
backend that `edgeattn serve` runs; a decoder repository streams, through /generate_stream, the tokens that
`Generator.generate` gives for the same prompt. The server's Python gets numpy < 2 from
`<venv>/tritonserver-site` (scripts/setup.sh puts it there) and edgeattn from this virtualenv.
"""

from __future__ import annotations

import ctypes.util
import json
import sys
import sysconfig
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from decoder_fixtures import requires_decoder_stack, tiny_decoder  # noqa: F401
from edgeattn.bundle.build import BuildConfig, build
from edgeattn.bundle.folder import open_bundle
from edgeattn.runtime.backends import open_backend
from edgeattn.tritonserver.repository import TritonConfig, export_triton
from edgeattn.tritonserver.wheel_server import ServerPorts, WheelServer

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
        sampling = SamplingConfig(temperature=1.0, top_p=0.9, seed=7)
        sampled = generator.generate(prompts[1], GenerationConfig(max_tokens=16, sampling=sampling))
        assert len(set(sampled.tokens)) > 4 and len(sampled.text) > 12  # not one token repeated
        stop = sampled.text[8:11]
        stopped = generator.generate(prompts[1], GenerationConfig(max_tokens=16, sampling=sampling, stop=(stop,)))
    assert stopped.finish_reason == "stop" and len(stopped.tokens) < len(sampled.tokens)

    server = serve(repo)
    for body, message in (({"text_input": prompts[0], "window": 10_000}, "window: expected 0"),
                          ({"text_input": prompts[0], "max_tokens": 0}, "max_tokens: expected an integer >= 1"),
                          ({"text_input": ""}, "empty prompt"), ({"prompt": prompts[0]}, "text_input")):
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
    assert {e["window"] for e in events} == {8}
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
