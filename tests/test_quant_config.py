"""Quantization configs and bad inputs: each is refused with a clear error before any training starts."""

from __future__ import annotations

import json

import pytest

from edgeattn.cli.main import cli
from edgeattn.errors import ConfigError
from edgeattn.quantize.config import (FP8Config, LayerOverride, W4Config, W8A8Config, config_from_dict,
                                      config_from_name, config_to_dict)


def test_configs_validate_on_construction():
    with pytest.raises(ConfigError, match="block_size: expected one of 32, 64, 128, found 48"):
        W4Config(block_size=48)
    with pytest.raises(ConfigError, match="act_observer"):
        W8A8Config(act_observer="minmax")
    with pytest.raises(ConfigError, match="expected one of w8a8, w4, fp8, found 'int3'"):
        config_from_name("int3")
    with pytest.raises(ConfigError, match="applies to w4 only"):
        config_from_name("w8a8", block_size=64)


def test_overrides_pick_the_last_match_and_float():
    cfg = W8A8Config(overrides=(LayerOverride("*.output.dense", W4Config(block_size=64)),
                                LayerOverride("layer.5.output.dense", None)))
    assert cfg.for_layer("layer.0.attention.self.query") is cfg
    assert isinstance(cfg.for_layer("layer.0.output.dense"), W4Config)
    assert cfg.for_layer("layer.5.output.dense") is None


def test_config_round_trips_with_type_tag_and_version():
    cfg = W8A8Config(act_observer="mse", overrides=(LayerOverride("lm_head", None),
                                                    LayerOverride("*.mlp.*", W4Config(block_size=128))))
    d = json.loads(json.dumps(config_to_dict(cfg)))
    assert d["type"] == "w8a8" and d["version"] == 1
    assert config_from_dict(d) == cfg
    assert config_from_dict(config_to_dict(FP8Config())) == FP8Config()


def _clean_failure(result, *phrases):
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip() and not ln.startswith(("Loading", "[transformers]"))]
    assert lines and lines[-1].startswith("Error: "), result.stderr
    for p in phrases:
        assert p in lines[-1]
    assert "Traceback" not in result.output
    assert "QAT" not in result.stderr  # no training step started


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    from quant_models import save_tiny_bert

    return save_tiny_bert(tmp_path_factory.mktemp("bert"))


def test_unknown_config(runner, tmp_path, bert_dir):
    r = runner.invoke(cli, ["quantize", "--model", str(bert_dir), "--config", "int2", "--out", str(tmp_path / "o.onnx")])
    _clean_failure(r, "expected one of w8a8, w4, fp8", "int2")


def test_block_size_must_divide_the_input_dimension(runner, tmp_path, bert_dir):
    # the tiny BERT has hidden 96: 64 does not divide it (32 does)
    r = runner.invoke(cli, ["quantize", "--model", str(bert_dir), "--config", "w4", "--block-size", "64",
                            "--out", str(tmp_path / "o.onnx")])
    _clean_failure(r, "block size 64 does not divide the input dimension", "(96)")
    assert not (tmp_path / "o.onnx").exists()


def test_empty_calibration_file(runner, tmp_path, bert_dir):
    calib = tmp_path / "calib.txt"
    calib.write_text("\n  \n")
    r = runner.invoke(cli, ["quantize", "--model", str(bert_dir), "--config", "w8a8", "--calib", str(calib),
                            "--out", str(tmp_path / "o.onnx")])
    _clean_failure(r, "calib.txt", "found no text")


def test_model_directory_without_weights(runner, tmp_path, bert_dir):
    empty = tmp_path / "noweights"
    empty.mkdir()
    (empty / "config.json").write_text((bert_dir / "config.json").read_text())
    r = runner.invoke(cli, ["quantize", "--model", str(empty), "--config", "w8a8", "--out", str(tmp_path / "o.onnx")])
    _clean_failure(r, "has no weights")
