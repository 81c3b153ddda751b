"""Quantization configs dispatch through a public registry: a config defined and registered here (INT8
weights only, with a handler of its own) quantizes a model, exports, and is an `edgeattn quantize --config`."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from edgeattn.cli.main import cli
from edgeattn.errors import ConfigError
from edgeattn.quantize import calibrate, export_qdq, quantize_
from edgeattn.quantize.api import HANDLERS, register_handler
from edgeattn.quantize.config import CONFIGS, QuantConfig, config_from_name, config_names, register_config
from edgeattn.quantize.qlinear import QuantLinear
from quant_models import tiny_bert, token_batch


@dataclass(frozen=True)
class W8OnlyConfig(QuantConfig):
    """INT8 weights per output channel, float activations."""

    name = "w8-test"
    weight_format = "int8"
    quantize_inputs = False


CALLS: list[str] = []


@pytest.fixture
def registered():
    register_config(W8OnlyConfig)

    @register_handler(W8OnlyConfig)
    def wrap(linear, config):
        CALLS.append(config.name)
        return QuantLinear(linear, config)

    yield W8OnlyConfig
    CONFIGS.pop(W8OnlyConfig.name)
    HANDLERS.pop(W8OnlyConfig)
    CALLS.clear()


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_a_registered_config_quantizes_and_exports(registered, tmp_path):
    assert config_names()[:3] == ["w8a8", "w4", "fp8"] and config_names()[-1] == "w8-test"
    config = config_from_name("w8-test")
    model = tiny_bert(0)
    teacher = copy.deepcopy(model)
    report = quantize_(model, config)
    assert len(CALLS) == len(report.quantized) == 12  # 2 layers x (q, k, v, attention out, intermediate, out)
    assert report.shared_inputs == []  # no activation quantizers to share
    calibrate(model, [token_batch(8, 12, seed=1)])
    batch = token_batch(4, 12, seed=3)
    with torch.no_grad():
        want = teacher(**batch).last_hidden_state.numpy()
        got = model(**batch).last_hidden_state.numpy()
    assert _cosine(got, want) > 0.999  # int8 per-channel weights alone lose little
    assert np.abs(got - want).max() > 1e-6  # and something was quantized
    path = tmp_path / "w8.onnx"
    summary = export_qdq(model, "encoder", path)
    assert summary["quantized_matmuls"] == 12 and summary["activation_qdq"] == 0
    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert "QuantizeLinear" not in ops and ops.count("DequantizeLinear") == 12  # weights only
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ort_out = sess.run(None, {k: v.numpy() for k, v in batch.items()})[0]
    assert _cosine(ort_out, got) > 0.99999 and np.abs(ort_out - got).max() < 5e-3  # the export runs what trained


def test_the_cli_takes_its_choices_from_the_registry(registered, runner, tmp_path):
    from quant_models import save_tiny_bert

    folder = save_tiny_bert(tmp_path / "bert")
    calib = tmp_path / "calib.txt"
    calib.write_text("\n".join(" ".join(f"w{(i * 7 + j) % 60}" for j in range(10)) + " ." for i in range(40)))
    out = tmp_path / "bert.w8.onnx"
    r = runner.invoke(cli, ["quantize", "--model", str(folder), "--config", "w8-test", "--calib", str(calib),
                            "--steps", "0", "--seq-len", "16", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "12 quantized MatMuls" in r.stdout and "INT8 12 weights" in r.stdout and "0 activation Q/DQ" in r.stdout
    assert CALLS == ["w8-test"] * 13  # AutoModel adds a pooler, which the exported graph does not use


def test_the_help_and_choices_follow_the_registry_after_the_cli_loaded(runner):
    """The commands read the registry when they run: a config registered after the CLI was imported is listed
    and accepted, and one removed is neither (the help once kept whatever was registered at import)."""
    assert "w8-test" not in runner.invoke(cli, ["quantize", "--help"]).output  # the command module is now loaded
    register_config(W8OnlyConfig)
    try:
        assert "w8a8, w4, fp8, w8-test" in " ".join(runner.invoke(cli, ["quantize", "--help"]).output.split())
        assert "w8-test" in runner.invoke(cli, ["sparsify", "--help"]).output
    finally:
        CONFIGS.pop(W8OnlyConfig.name)
    assert "w8-test" not in runner.invoke(cli, ["quantize", "--help"]).output
    r = runner.invoke(cli, ["sparsify", "unused-model", "--qat", "w8-test", "--out", "unused"])
    assert r.exit_code == 2 and "'w8-test' is not one of 'w8a8', 'w4', 'fp8'" in r.output, r.output


def test_registration_is_checked():
    with pytest.raises(ConfigError, match="expected a new name for .*Other, found 'w8a8', which W8A8Config has"):
        @register_config
        @dataclass(frozen=True)
        class Other(QuantConfig):
            name = "w8a8"
    with pytest.raises(ConfigError, match="weight_format: expected one of int8, int4, fp8, found 'int2'"):
        @register_config
        @dataclass(frozen=True)
        class Int2(QuantConfig):
            name = "int2-test"
            weight_format = "int2"
    with pytest.raises(ConfigError, match="expected a QuantConfig subclass"):
        register_handler(dict)
    assert "int2-test" not in CONFIGS
