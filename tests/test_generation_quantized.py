"""QAT decoders (W8A8, W4): exported with the cache as Q/DQ ONNX, built for the cpu, generating through the
same API; their logits follow the fake-quantized PyTorch model's."""

from __future__ import annotations

import pytest

from decoder_fixtures import bundle_and_torch_logits, cosines, requires_decoder_stack, tiny_llama

pytestmark = [requires_decoder_stack, pytest.mark.slow]


@pytest.mark.parametrize("config_name", ["w8a8", "w4"])
def test_quantized_decoder_bundle_generates(config_name, tmp_path):
    import torch

    from edgeattn.bundle.build import BuildConfig, build
    from edgeattn.decoder.export import DecoderExportConfig
    from edgeattn.quantize.decoder_qdq import export_decoder_qdq
    from edgeattn.quantize import calibrate, config_from_name, quantize_
    from edgeattn.runtime.generation.generator import GenerationConfig, Generator

    model, tok = tiny_llama()
    quantize_(model, config_from_name(config_name))
    batches = [{"input_ids": torch.randint(100, 5000, (2, 24)), "attention_mask": torch.ones(2, 24, dtype=torch.long)}
               for _ in range(2)]
    calibrate(model, batches)
    summary = export_decoder_qdq(model, tok, tmp_path / "q.onnx", DecoderExportConfig(sinks=4, window_max=48))
    from edgeattn.quantize.api import quant_linears

    assert summary["quantized_matmuls"] == len(quant_linears(model)) >= 2 * 7  # q, k, v, o, gate, up, down x 2
    # the cpu build runs integer kernels, which round activations a step differently from Q/DQ in float; on this
    # random model (logits up to ~9) that moves single logits by ~1, so the build's 5% bound is widened and the
    # check below is a cosine against the fake-quantized PyTorch model
    bundle = build(tmp_path / "q.onnx", BuildConfig(target="cpu", seq=(1, 1, 32), dims=(("cache", (8, 52, 52)),),
                                                    parity_tolerance=2.0))
    cos = cosines(*bundle_and_torch_logits(model, bundle.path))
    with Generator.open(bundle.path) as gen:
        result = gen.generate(list(range(300, 330)), GenerationConfig(max_tokens=6))
    assert cos.min() > 0.99, cos.min()  # integer kernels round activations a step differently from Q/DQ in float
    assert 1 <= result.completion_tokens <= 6


def test_quantize_cli_writes_a_decoder(tmp_path, runner):
    from decoder_fixtures import tiny_llama
    from edgeattn.cli.main import cli

    model, tok = tiny_llama()
    model.save_pretrained(tmp_path / "hf")
    tok.save_pretrained(tmp_path / "hf")
    out = tmp_path / "q.onnx"
    result = runner.invoke(cli, ["quantize", "--model", str(tmp_path / "hf"), "--config", "w8a8", "--steps", "0",
                                 "--batch-size", "2", "--seq-len", "16", "--decoder",
                                 "--window-max", "48", "--out", str(out)])
    assert result.exit_code == 0, result.output
    import onnx

    m = onnx.load(str(out), load_external_data=False)
    names = [i.name for i in m.graph.input]
    assert names[:3] == ["input_ids", "cache_position", "attention_window"] and "past_key_values.1.key" in names
    assert sum(n.op_type == "DequantizeLinear" for n in m.graph.node) >= 14
    assert any(p.key == "edgeattn.decoder" for p in m.metadata_props)
