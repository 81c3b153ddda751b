"""The two references agree with each other and with plain softmax attention where they must."""

import numpy as np
import pytest

from edgeattn.attention.reference import allowed_mask_np, windowed_attention_np
from onnx_fixtures import requires_torch


def test_full_window_is_plain_attention():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 5, 4)) for _ in range(3))
    s = np.einsum("bhqd,bhkd->bhqk", q, k) / 2.0
    w = np.exp(s - s.max(-1, keepdims=True))
    want = np.einsum("bhqk,bhkd->bhqd", w / w.sum(-1, keepdims=True), v)
    np.testing.assert_allclose(windowed_attention_np(q, k, v, 0, causal=False), want, atol=1e-12)


def test_mask_shapes_of_the_spec():
    causal = allowed_mask_np(5, 5, 2, 1, True).astype(int)
    assert causal.tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 1, 1, 0], [1, 0, 0, 1, 1]]
    band = allowed_mask_np(4, 4, 2, 0, False).astype(int)
    assert band.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]]
    decode = allowed_mask_np(1, 6, 3, 2, True).astype(int)  # the query is the last position
    assert decode.tolist() == [[1, 1, 0, 1, 1, 1]]


def test_fully_padded_row_is_zero():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 1, 3, 4)) for _ in range(3))
    out = windowed_attention_np(q, k, v, 1, causal=True, key_padding_mask=np.array([[0, 1, 1]]))
    assert np.all(out[0, 0, 0] == 0) and np.all(np.isfinite(out))


def test_negative_window_is_refused():
    with pytest.raises(ValueError, match="window"):
        windowed_attention_np(np.zeros((1, 1, 2, 2)), np.zeros((1, 1, 2, 2)), np.zeros((1, 1, 2, 2)), -1)


@requires_torch
@pytest.mark.parametrize("causal", [True, False])
def test_torch_matches_numpy_with_gqa(causal):
    import torch

    from edgeattn.attention.reference import windowed_attention_torch

    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 7, 8, generator=g)
    k, v = torch.randn(2, 2, 7, 8, generator=g), torch.randn(2, 2, 7, 8, generator=g)
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    got = windowed_attention_torch(q, k, v, 3, sinks=1, causal=causal, key_padding_mask=mask)
    want = windowed_attention_np(q.numpy(), k.numpy(), v.numpy(), 3, sinks=1, causal=causal,
                                 key_padding_mask=mask.numpy())
    np.testing.assert_allclose(got.numpy(), want, atol=1e-5)
