"""Weight-only int4 (edgeattn.decoder.weight_only) on the tiny decoder: structure, metadata, a bundle that
says its weights are int4, and logits close to the float model's (a cosine, never bit equality)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from decoder_fixtures import bundle_and_torch_logits, cosines, requires_decoder_stack
from edgeattn.errors import ConfigError, ModelError

pytestmark = requires_decoder_stack


@pytest.fixture(scope="module")
def int4_decoder(tiny_decoder, tmp_path_factory):
    from edgeattn.decoder.weight_only import quantize_weights_int4

    _, _, onnx_path, _ = tiny_decoder
    return quantize_weights_int4(onnx_path, tmp_path_factory.mktemp("int4") / "tiny_int4.onnx", block=32)


def test_every_constant_matmul_becomes_int4_and_the_metadata_says_so(tiny_decoder, int4_decoder):
    import onnx

    from edgeattn.decoder.metadata import DECODER_KEY
    from edgeattn.decoder.weight_only import weight_only_info

    model, _, onnx_path, _ = tiny_decoder
    q = onnx.load(str(int4_decoder))
    ops = [n.op_type for n in q.graph.node]
    layers = model.config.num_hidden_layers
    assert ops.count("MatMulNBits") == 7 * layers + 1  # q, k, v, o, gate, up, down per layer + the LM head
    assert "MatMul" not in ops  # attention's MatMuls live in the cached op's body, not the graph
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in q.graph.node[ops.index("MatMulNBits")].attribute}
    assert attrs["bits"] == 4 and attrs["block_size"] == 32 and attrs["accuracy_level"] == 4
    info = weight_only_info(q)
    assert info["block"] == 32 and info["symmetric"] and info["matmuls"] == 7 * layers + 1
    assert weight_only_info(onnx.load(str(onnx_path))) is None
    decoder = json.loads({p.key: p.value for p in q.metadata_props}[DECODER_KEY])
    assert decoder["weights"].startswith("int4 weight-only")


def test_int4_bundle_generates_close_to_the_float_model(tiny_decoder, int4_decoder):
    from edgeattn.bundle.build import BuildConfig, build

    model, _, _, _ = tiny_decoder
    bundle = build(int4_decoder, BuildConfig(target="cpu", seq=(1, 1, 32), dims=(("cache", (8, 52, 52)),)))
    manifest = bundle.manifest
    assert manifest.sections["decoder"]["weights"].startswith("int4")
    # the cpu build packs Q/K/V and gate/up: 4 products a layer and the LM head
    assert manifest.precision["compute_layers"].get("int4") == 4 * model.config.num_hidden_layers + 1
    got, want = bundle_and_torch_logits(model, bundle.path)
    cos = cosines(got, want)
    assert cos.min() > 0.98, cos.min()
    assert np.abs(got - want).max() > 1e-4  # it really ran the quantized weights


def test_bad_settings_are_clear_errors(tiny_decoder, int4_decoder, tmp_path):
    from edgeattn.decoder.weight_only import WeightOnlyConfig, quantize_weights_int4

    _, _, onnx_path, _ = tiny_decoder
    with pytest.raises(ConfigError, match="block: expected 16, 32, 64, 128 or 256, found 48"):
        WeightOnlyConfig(block=48)
    with pytest.raises(ConfigError, match="bits: expected 4"):
        WeightOnlyConfig(bits=8)
    with pytest.raises(ConfigError, match="other than the source"):
        quantize_weights_int4(onnx_path, onnx_path)
    with pytest.raises(ModelError, match="already quantized"):
        quantize_weights_int4(int4_decoder, tmp_path / "twice.onnx")
