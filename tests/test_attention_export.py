"""ExportConfig(attention="windowed"): HF attention swapped for the op, exported, run by ONNX Runtime, built."""

import numpy as np
import onnx
import pytest

from edgeattn.bundle.build import BuildConfig, build
from onnx_fixtures import requires_torch

pytestmark = requires_torch


def _tiny_llama():
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    cfg._attn_implementation = "eager"
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def windowed_llama(tmp_path_factory):
    from edgeattn.export import ExportConfig, export_module

    model = _tiny_llama()
    path = tmp_path_factory.mktemp("windowed") / "llama-windowed.onnx"
    export_module(model, "decoder", path, ExportConfig(attention="windowed", sinks=2))
    return path, model


def test_export_has_the_op_and_the_window_input(windowed_llama):
    path, _ = windowed_llama
    model = onnx.load(str(path), load_external_data=False)
    ops = [n for n in model.graph.node if n.domain == "edgeattn"]
    assert len(ops) == 2 and all(n.op_type == "WindowedAttention" for n in ops)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in ops[0].attribute}
    assert attrs["causal"] == 1 and attrs["sinks"] == 2 and attrs["plugin_namespace"] == b"edgeattn"
    assert [f.name for f in model.functions if f.domain == "edgeattn"] == ["WindowedAttention"]
    window = next(i for i in model.graph.input if i.name == "attention_window")
    assert window.type.tensor_type.elem_type == onnx.TensorProto.INT64


def test_onnx_runtime_matches_torch_at_each_window(windowed_llama):
    import onnxruntime as ort
    import torch

    path, model = windowed_llama  # export_module switched `model` to the windowed op
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = torch.randint(0, 1000, (2, 13), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, 10:] = 0
    real = mask.numpy().astype(bool)
    for window in (0, 2, 5):
        with torch.no_grad():
            want = model(input_ids=ids, attention_mask=mask, use_cache=False,
                         edgeattn_window=torch.tensor(window)).logits.numpy()
        got = sess.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy(),
                              "attention_window": np.array(window)})[0]
        np.testing.assert_allclose(got[real], want[real], atol=1e-4)


def test_windowed_export_builds_without_refusing(windowed_llama, tmp_path):
    path, _ = windowed_llama
    bundle = build(path, BuildConfig(target="cpu", out=tmp_path / "b", seq=(1, 16, 32), strict=True))
    details = next(p for p in bundle.manifest.sections["passes"] if p["name"] == "fuse-attention")["details"]
    assert (details["fused"], details["already_windowed"]) == (0, 2)
    assert bundle.manifest.input("window").name == "attention_window"
    assert bundle.manifest.sections["parity"]["status"] == "pass"
