"""torch.ops.edgeattn.windowed_attention: schema, fake kernel, CPU path against the reference."""

from __future__ import annotations

import numpy as np
import pytest

from onnx_fixtures import has

pytestmark = [pytest.mark.torch, pytest.mark.skipif(not has("torch"), reason="needs PyTorch")]


@pytest.fixture(scope="module")
def op():
    import torch

    import edgeattn.plugins.kernels.torch_ops  # noqa: F401  registers the op

    return torch.ops.edgeattn.windowed_attention


def _inputs(s_q=7, s_k=11, h=4, h_kv=2, d=8):
    import torch

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, h, s_q, d, generator=gen)
    k, v = (torch.randn(2, h_kv, s_k, d, generator=gen) for _ in range(2))
    return q, k, v


def test_cpu_matches_numpy_reference(op):
    import torch

    from edgeattn.attention.reference import windowed_attention_np

    q, k, v = _inputs()
    mask = torch.tensor([[1] * 11, [0] * 3 + [1] * 8], dtype=torch.bool)
    out = op(q, k, v, torch.tensor(3), 2, True, 0.0, mask)
    ref = windowed_attention_np(q.numpy(), k.numpy(), v.numpy(), 3, sinks=2, causal=True, key_padding_mask=mask.numpy())
    np.testing.assert_allclose(out.numpy(), ref, atol=1e-5)


def test_defaults_and_keywords(op):
    import torch

    q, k, v = _inputs(s_q=5, s_k=5)
    a = op(q, k, v, torch.tensor(0))
    b = op(q, k, v, torch.tensor(0), sinks=0, causal=True, scale=0.0, key_padding_mask=None)
    assert torch.equal(a, b)


def test_opcheck_schema_and_fake_kernel(op):
    import torch

    q, k, v = _inputs()
    torch.library.opcheck(op, (q, k, v, torch.tensor(4), 1, False, 0.25, None),
                          test_utils=("test_schema", "test_faketensor"))


def test_negative_or_float_window_is_refused(op):
    import torch

    from edgeattn.errors import InputError

    q, k, v = _inputs()
    with pytest.raises(InputError, match="window: expected >= 0"):
        op(q, k, v, torch.tensor(-1), 0, True, 0.0, None)
    with pytest.raises(InputError, match="integer scalar"):
        op(q, k, v, torch.tensor(2.0), 0, True, 0.0, None)
