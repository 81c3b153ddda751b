"""Attention and GELU as the common exporters spell them, each from a real export of a small model.

- TorchScript, opsets 14-17, with transformers' default SDPA attention: Q and K^T each scaled by
  sqrt(scale) before the MatMul, a NaN guard Where(IsNaN(w), 0, w) after the softmax, and GELU's
  sqrt(2) held in a Constant node;
- the dynamo exporter at opset 18 (SDPA decomposed), at opset 20 (GELU is the Gelu op) and the opset-23
  Attention op.
Each build is --strict (every block fused) and checked against the source; the TorchScript SDPA form is
also checked against the windowed torch model at a window of 3, so the scale and mask were read right.
"""

import numpy as np
import pytest

from edgeattn.bundle.build import BuildConfig, build
from export_fixtures import window_reference
from onnx_fixtures import requires_torch

pytestmark = requires_torch


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """(family, exporter, opset, attention) -> (onnx path, torch model, kind), exported once per module."""
    from edgeattn.export import ExportConfig, export_module
    from test_fusion_models import _tiny

    folder, cache = tmp_path_factory.mktemp("spellings"), {}

    def get(family: str, exporter: str, opset: int, attn: str):
        key = (family, exporter, opset, attn)
        if key not in cache:
            model, kind = _tiny(family, attn)
            model.config._attn_implementation = attn
            path = export_module(model, kind, folder / f"{'-'.join(map(str, key))}.onnx",
                                 ExportConfig(exporter=exporter, opset=opset))
            cache[key] = (path, model, kind)
        return cache[key]

    return get


def details(bundle, name: str) -> dict:
    return next(p for p in bundle.manifest.sections["passes"] if p["name"] == name)["details"]


def built(path, tmp_path):
    bundle = build(path, BuildConfig(target="cpu", out=tmp_path / "b", seq=(1, 24, 64), strict=True))
    parity = bundle.manifest.sections["parity"]
    assert parity["status"] == "pass" and parity["max_abs_diff"] <= 1e-4
    return bundle


@pytest.mark.parametrize("opset", [14, 15, 16, 17])
def test_torchscript_sdpa_bert(export, tmp_path, opset):
    path, _, _ = export("bert", "torchscript", opset, "sdpa")
    bundle = built(path, tmp_path)
    assert details(bundle, "fuse-attention")["fused"] == 2
    assert details(bundle, "fuse-gelu-cpu")["fused"] == 2  # x * (erf(x / Constant(sqrt 2)) + 1) * 0.5


def test_torchscript_sdpa_llama_gqa(export, tmp_path):
    path, _, _ = export("llama", "torchscript", 17, "sdpa")
    assert details(built(path, tmp_path), "fuse-attention")["fused"] == 2


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_torchscript_sdpa_follows_the_window_like_the_torch_swap(export, tmp_path, family):
    from edgeattn.runtime.backends.onnxruntime import OnnxRuntimeBackend

    path, model, kind = export(family, "torchscript", 17, "sdpa")
    bundle, feeds, want, real = window_reference(path, model, kind, tmp_path / "b")
    with OnnxRuntimeBackend(bundle.path / "model.onnx") as ort_model:
        got = next(iter(ort_model.infer(feeds).values()))
    np.testing.assert_allclose(got[real], want[real], atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("opset,gelu_op", [(18, 0), (20, 2)])
def test_dynamo_sdpa_bert(export, tmp_path, opset, gelu_op):
    path, _, _ = export("bert", "dynamo", opset, "sdpa")
    bundle = built(path, tmp_path)
    assert details(bundle, "upgrade-opset") == {"from": opset, "to": opset}
    assert details(bundle, "fuse-attention")["fused"] == 2
    gelu = details(bundle, "fuse-gelu-cpu")
    assert (gelu["fused"], gelu["native"]) == (2 - gelu_op, gelu_op)  # opset 20 writes the Gelu op itself


@pytest.mark.slow
def test_dynamo_attention_op_bert(export, tmp_path):
    import onnx

    path, _, _ = export("bert", "dynamo", 23, "sdpa")
    assert sum(n.op_type == "Attention" for n in onnx.load(str(path)).graph.node) == 2
    bundle = built(path, tmp_path)
    assert details(bundle, "fuse-attention")["fused"] == 2
