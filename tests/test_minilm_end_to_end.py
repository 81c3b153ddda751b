"""The main job on the embedded default: export the real MiniLM, build a cpu bundle, run it."""

import numpy as np
import onnxruntime as ort
import pytest

from edgeattn.bundle.build import BuildConfig, build
from onnx_fixtures import requires_minilm, requires_torch


@pytest.fixture(scope="module")
def minilm_onnx(tmp_path_factory):
    from edgeattn.export import ExportConfig, export_hf

    return export_hf("minilm", tmp_path_factory.mktemp("minilm") / "minilm.onnx", ExportConfig())


@requires_torch
@requires_minilm
def test_minilm_bundle_matches_torch_and_source(minilm_onnx):
    import torch

    from edgeattn import hf_models

    bundle = build(minilm_onnx, BuildConfig(target="cpu", seq=(1, 16, 128)))
    parity = bundle.manifest.sections["parity"]
    print(f"bundle vs source ONNX: max abs diff {parity['max_abs_diff']:.3g}")
    assert parity["status"] == "pass" and parity["max_abs_diff"] <= 1e-4
    assert bundle.manifest.precision["compute_layers"]["float"] >= 36  # 6 layers x 6 Linear
    fusion = next(p for p in bundle.manifest.sections["passes"] if p["name"] == "fuse-attention")
    assert fusion["details"]["fused"] == 6 and not fusion["problems"]
    assert bundle.manifest.input("window").name == "attention_window"

    model, tok, kind = hf_models.load("minilm")
    assert kind == "encoder"
    enc = tok(["edge devices run transformers", "a second, longer sentence to pad the batch"],
              padding=True, return_tensors="np")
    feeds = {"input_ids": enc["input_ids"].astype(np.int64), "attention_mask": enc["attention_mask"].astype(np.int64)}
    got = ort.InferenceSession(str(bundle.artifact)).run(None, {**feeds, "attention_window": np.array(0)})[0]
    with torch.no_grad():
        want = model(input_ids=torch.from_numpy(feeds["input_ids"]),
                     attention_mask=torch.from_numpy(feeds["attention_mask"])).last_hidden_state.numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)
