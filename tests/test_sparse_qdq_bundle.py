"""A 2:4 + W8A8 Q/DQ encoder through the cpu build: the manifest describes the bundle as built.

Attention fusion packs each layer's q/k/v projections into one QAttention weight under a new name; the
2:4 check still finds those layers (by their weights' digests) and reports no problem, a pooler the export
left out is not expected in the graph, and the integer GEMMs count as int8 compute layers."""

from __future__ import annotations

import json

import onnx
import pytest

from onnx_fixtures import has, requires_torch

pytestmark = [requires_torch, pytest.mark.torch, pytest.mark.slow,  # an export and a build: ~100 s on 2 busy cores
              pytest.mark.skipif(not has("transformers"), reason="needs transformers")]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    import torch
    import transformers

    from edgeattn.bundle.build import BuildConfig, build
    from edgeattn.quantize.api import calibrate, quantize_
    from edgeattn.quantize.config import W8A8Config
    from edgeattn.quantize.sparsity.masks import SparsityConfig, sparsify_
    from edgeattn.quantize.sparsity.pipeline import decisions_of, export_sparse_qdq
    from quant_models import token_batch

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=1024, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=64, attn_implementation="eager")
    model = transformers.BertModel(config).eval()  # with a pooler, which the embedding export leaves out
    report = sparsify_(model, SparsityConfig(method="magnitude"))
    quantize_(model, W8A8Config())
    calibrate(model, [token_batch(4, 12, seed=i) for i in range(2)])
    folder = tmp_path_factory.mktemp("sparse_qdq")
    export_sparse_qdq(model, "encoder", folder / "m.onnx", report.pruned, decisions_of(report))
    bundle = build(folder / "m.onnx", BuildConfig(target="cpu", out=folder / "m.edgeattn", seq=(1, 16, 32)))
    return report, folder / "m.onnx", bundle.manifest


def _pass(manifest, name):
    return next(p for p in manifest.sections["passes"] if p["name"] == name)


def test_the_metadata_names_only_the_pruned_layers_in_the_graph(built):
    from edgeattn.passes.check_sparsity import METADATA_KEY, WEIGHTS_KEY

    report, path, _ = built
    meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert "pooler.dense" in report.pruned
    assert json.loads(meta[METADATA_KEY]) == [n for n in report.pruned if n != "pooler.dense"]
    assert set(json.loads(meta[WEIGHTS_KEY])) == set(json.loads(meta[METADATA_KEY]))


def test_fused_qkv_layers_are_found_and_no_problem_is_reported(built):
    _, _, manifest = built
    assert _pass(manifest, "attention-body")["details"]["fused_kernels"] == 2  # q/k/v packed into QAttention
    assert manifest.sections["problems"] == []
    check = _pass(manifest, "check-sparsity")["details"]
    fused = [e for e in check["layers"] if e["op"] == "QAttention"]
    assert len(fused) == 2 and all(e["sparse"] for e in fused)
    assert sorted(c for e in fused for c in e["covers"]) == sorted(
        f"encoder.layer.{i}.attention.self.{p}" for i in range(2) for p in ("query", "key", "value"))


def test_integer_gemms_count_as_int8_compute_layers(built):
    _, _, manifest = built
    # 2 layers x (q, k, v in QAttention; attention output, intermediate, output as MatMulIntegerToFloat) in int8,
    # the scores and the weighted sum of each attention in float
    assert manifest.precision["compute_layers"] == {"int8": 12, "float": 4}


def test_the_report_says_so(built, tmp_path):
    from edgeattn.bundle.report import render

    text = render(built[2])
    line = next(x for x in text.splitlines() if "compute layers:" in x)
    assert "12 int8" in line and "4 float" in line, line
    assert text.rstrip().endswith("None.")  # the Problems section
