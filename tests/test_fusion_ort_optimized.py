"""fuse-attention on graphs rewritten by ONNX Runtime's transformers optimizer (com.microsoft ops).

The real MiniLM export after `optimize_model(model_type="bert")` (Attention with packed Q/K/V and a 1-D
mask_index; MultiHeadAttention; the raw 2-D mask) fuses 6/6 and the bundle matches the optimized model
and the original export; at a window of 3 it computes what the torch model with the windowed op computes.
Small graphs written as code check the causal form against numpy and the reasons of the forms that stay.
"""

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from edgeattn.bundle.build import BuildConfig, build
from edgeattn.passes import PassContext
from edgeattn.passes.fuse_attention import FuseAttention
from edgeattn.targets import resolve_target
from foreign_fixtures import contrib_attention, contrib_reference, op_counts, ort_optimized
from onnx_fixtures import requires_minilm, requires_torch

KEPT = ("com.microsoft:SkipLayerNormalization", "com.microsoft:BiasGelu", "com.microsoft:EmbedLayerNormalization")


@pytest.fixture(scope="session")
def minilm_exports(tmp_path_factory):
    """The stock TorchScript opset-17 MiniLM export and its ORT-optimized forms, made once per session."""
    from edgeattn.export import ExportConfig, export_hf

    folder = tmp_path_factory.mktemp("ort-optimized")
    src = export_hf("minilm", folder / "minilm.onnx", ExportConfig(exporter="torchscript", opset=17))
    forms = {"attention": {}, "mha": {"mha": True}, "raw-mask": {"raw_mask": True}}
    return src, {name: ort_optimized(src, folder / f"minilm-{name}.onnx", **kw) for name, kw in forms.items()}


def _passes(bundle) -> dict:
    return {p["name"]: p["details"] for p in bundle.manifest.sections["passes"]}


def _run(path, feeds):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in names})[0]


def _padded_feeds(seq: int = 21):
    rng = np.random.default_rng(3)
    ids = rng.integers(1000, 5000, (2, seq)).astype(np.int64)
    mask = np.ones((2, seq), np.int64)
    mask[1, seq - 4:] = 0
    return {"input_ids": ids, "attention_mask": mask}, mask.astype(bool)


@requires_minilm
@requires_torch
@pytest.mark.parametrize("form,op", [("attention", "Attention"), ("mha", "MultiHeadAttention"),
                                     ("raw-mask", "Attention")])
def test_optimized_minilm_fuses_six_of_six(minilm_exports, tmp_path, form, op):
    src, optimized = minilm_exports
    path = optimized[form]
    assert op_counts(path)[f"com.microsoft:{op}"] == 6
    bundle = build(path, BuildConfig(target="cpu", out=tmp_path / "b", seq=(1, 32, 128)))
    details = _passes(bundle)
    assert details["fuse-attention"]["fused"] == 6 and details["fuse-attention"]["unfused"] == []
    assert details["upgrade-opset"] == {"from": 17, "to": 18}
    parity = bundle.manifest.sections["parity"]  # against the optimized file it was built from
    assert parity["status"] == "pass" and parity["max_abs_diff"] <= 1e-4
    built = bundle.path / "model.onnx"
    counts = op_counts(built)
    assert "com.microsoft:Attention" not in counts and "com.microsoft:MultiHeadAttention" not in counts
    assert all(counts.get(k, 0) == op_counts(path).get(k, 0) for k in KEPT)  # ONNX Runtime still runs these
    feeds, real = _padded_feeds()  # a padded batch, window 0: the original export and the optimized model
    got = _run(built, {**feeds, "attention_window": np.array(0, np.int64)})
    np.testing.assert_allclose(got[real], _run(src, feeds)[real], atol=1e-4)
    np.testing.assert_allclose(got[real], _run(path, feeds)[real], atol=1e-4)


@requires_minilm
@requires_torch
def test_optimized_minilm_window_follows_the_torch_swap(minilm_exports, tmp_path):
    """At window 3 the fused optimized graph computes what MiniLM with the windowed torch op computes."""
    from edgeattn import hf_models
    from export_fixtures import window_reference

    _, optimized = minilm_exports
    model, _, kind = hf_models.load("minilm")
    bundle, feeds, want, real = window_reference(optimized["attention"], model, kind, tmp_path / "b")
    got = _run(bundle.path / "model.onnx", feeds)
    full = _run(bundle.path / "model.onnx", {**feeds, "attention_window": np.array(0, np.int64)})
    np.testing.assert_allclose(got[real], want[real], atol=1e-4)
    assert np.abs(got - full)[real].max() > 1e-2  # the window changed the result


@requires_torch
def test_optimized_gpt2_softmax_attention_after_skip_layer_norm(tmp_path):
    """model_type="gpt2" leaves softmax(QK^T)V in place behind SkipLayerNormalization (no ONNX shape
    inference): both blocks fuse, FastGelu and SkipLayerNormalization stay, parity holds."""
    from edgeattn.export import ExportConfig, export_module
    from foreign_fixtures import tiny_gpt2

    model = tiny_gpt2()
    src = export_module(model, "decoder", tmp_path / "gpt2.onnx", ExportConfig(exporter="torchscript", opset=17))
    path = ort_optimized(src, tmp_path / "gpt2-opt.onnx", model_type="gpt2", num_heads=4, hidden_size=64)
    assert op_counts(path)["com.microsoft:SkipLayerNormalization"] == 4
    bundle = build(path, BuildConfig(target="cpu", out=tmp_path / "b", seq=(1, 16, 64)))
    assert _passes(bundle)["fuse-attention"]["fused"] == 2
    assert bundle.manifest.sections["parity"]["status"] == "pass"
    counts = op_counts(bundle.path / "model.onnx")
    assert counts["com.microsoft:FastGelu"] == 2 and counts["com.microsoft:SkipLayerNormalization"] == 4


def _save(model: onnx.ModelProto, folder) -> str:
    path = folder / "m.onnx"
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("form", ["plain", "raw", "mha"])
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_contrib_forms_match_numpy_at_a_window(tmp_path, form, unidirectional):
    """Attention (1-D mask_index or 2-D mask) and MultiHeadAttention, causal or not: built, the window 3
    result equals the numpy reference with that window, and window 0 equals ONNX Runtime's own op."""
    path = _save(contrib_attention(form, unidirectional=unidirectional), tmp_path)
    bundle = build(path, BuildConfig(target="cpu", out=tmp_path / "b", seq=(1, 12, 32)))
    assert _passes(bundle)["fuse-attention"]["fused"] == 1
    assert bundle.manifest.sections["parity"]["status"] == "pass"
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 11, 16)).astype(np.float32)
    mask = np.ones((2, 11), np.int64)
    mask[1, 8:] = 0
    real = mask.astype(bool)
    for window in (0, 3):
        got = _run(bundle.path / "model.onnx", {"x": x, "attention_mask": mask, "attention_window": np.array(window)})
        want = contrib_reference(x, mask, causal=bool(unidirectional), window=window)
        np.testing.assert_allclose(got[real], want[real], atol=1e-5)
    source = _run(path, {"x": x, "attention_mask": mask})  # ONNX Runtime's own op, full attention
    np.testing.assert_allclose(source[real], contrib_reference(x, mask, causal=bool(unidirectional))[real], atol=1e-5)


@pytest.mark.parametrize("form,reason", [
    ("past", "com.microsoft Attention with a KV cache (past/present)"),
    ("bias", "com.microsoft Attention with an attention_bias input (relative position bias or ALiBi)"),
    ("gqa", "com.microsoft GroupQueryAttention is not mapped: it keeps its own KV cache"),
])
def test_forms_that_stay_are_reported_with_the_reason(form, reason):
    model = ir.serde.deserialize_model(contrib_attention(form))
    result = FuseAttention()(model, PassContext(resolve_target("cpu")))
    assert result.details["fused"] == 0
    [left] = result.details["unfused"]
    assert left["reason"].startswith(reason), left
    assert result.problems == [f"attention block at {left['node']} left unfused: {left['reason']}"]
    if form == "gqa":
        assert "local_window_size=4" in left["reason"]
