"""The torch module: eager numbers, input checks, dynamo export to the op, and the Hugging Face swap."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edgeattn.attention.reference import windowed_attention_np
from edgeattn.errors import ConfigError, InputError
from onnx_fixtures import requires_torch

pytestmark = requires_torch


def _qkv(b=2, h=4, h_kv=2, s=11, d=8, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, s, d, generator=g), torch.randn(b, h_kv, s, d, generator=g),
            torch.randn(b, h_kv, s, d, generator=g))


@pytest.mark.parametrize("causal,sinks,window", [(True, 0, 3), (True, 4, 2), (False, 0, 4), (False, 4, 0)])
def test_module_matches_reference(causal, sinks, window):
    import torch

    from edgeattn.attention.torch_module import WindowedAttention

    q, k, v = _qkv()
    pad = torch.ones(2, 11, dtype=torch.bool)
    pad[1, 8:] = False
    got = WindowedAttention(causal, sinks)(q, k, v, torch.tensor(window), pad)
    want = windowed_attention_np(q.numpy(), k.numpy(), v.numpy(), window, sinks=sinks, causal=causal,
                                 key_padding_mask=pad.numpy())
    np.testing.assert_allclose(got.numpy(), want, atol=1e-5)


@pytest.mark.parametrize("change,message", [
    (lambda q, k, v: (q, k, v[:, :, :-1]), "same shape"),
    (lambda q, k, v: (q[..., :4], k, v), "head size"),
    (lambda q, k, v: (q[:, :3], k, v), "multiple of H_kv"),
    (lambda q, k, v: (q[0], k, v), "4-D"),
])
def test_disagreeing_shapes_are_rejected(change, message):
    from edgeattn.attention.torch_module import windowed_attention

    with pytest.raises(InputError, match=message):
        windowed_attention(*change(*_qkv()), 2)


def test_bad_windows_are_rejected():
    import torch

    from edgeattn.attention.torch_module import windowed_attention

    q, k, v = _qkv()
    with pytest.raises(InputError, match=">= 0"):
        windowed_attention(q, k, v, torch.tensor(-1))
    with pytest.raises(InputError, match="integer scalar"):
        windowed_attention(q, k, v, torch.tensor(2.0))
    with pytest.raises(InputError, match="expected an int"):
        windowed_attention(q, k, v, 2.5)
    with pytest.raises(ConfigError, match="sinks"):
        windowed_attention(q, k, v, 2, sinks=-1)


def _export_layer(tmp_path, causal, sinks, window_example):
    import torch

    from edgeattn.attention.onnx_node import attach_function
    from edgeattn.attention.torch_module import WindowedAttention

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = WindowedAttention(causal, sinks)

        def forward(self, q, k, v, window, pad):
            return self.attn(q, k, v, window, pad)

    q, k, v = _qkv()
    pad = torch.ones(2, 11, dtype=torch.bool)
    seq = torch.export.Dim("seq")
    program = torch.onnx.export(Layer(), (q, k, v, window_example, pad), dynamo=True, opset_version=18,
                                input_names=["q", "k", "v", "window", "pad"],
                                dynamic_shapes=({2: seq}, {2: seq}, {2: seq}, None, {1: seq}))
    path = tmp_path / "layer.onnx"
    program.save(str(path))
    model = attach_function(onnx.load(str(path)))
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("causal,sinks", [(True, 4), (False, 0)])
def test_dynamo_export_emits_the_op_and_runs(tmp_path, causal, sinks):
    import torch

    model = _export_layer(tmp_path, causal, sinks, torch.tensor(3))
    ops = [n for n in model.graph.node if n.domain == "edgeattn"]
    assert [n.op_type for n in ops] == ["WindowedAttention"]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    q, k, v = (x.numpy() for x in _qkv(s=19, seed=1))
    pad = np.ones((2, 19), bool)
    pad[0, 15:] = False
    for window in (1, 5, 0, 40):
        got = sess.run(None, {"q": q, "k": k, "v": v, "window": np.array(window), "pad": pad})[0]
        want = windowed_attention_np(q, k, v, window, sinks=sinks, causal=causal, key_padding_mask=pad)
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_float_window_fails_at_export(tmp_path):
    import torch

    with pytest.raises(Exception, match="integer scalar"):
        _export_layer(tmp_path, True, 0, torch.tensor(3.0))


def test_windowed_export_config_checks():
    from edgeattn.export import ExportConfig

    with pytest.raises(ConfigError, match="dynamo"):
        ExportConfig(exporter="torchscript", attention="windowed")
    with pytest.raises(ConfigError, match="sinks"):
        ExportConfig(attention="windowed", sinks=-2)
