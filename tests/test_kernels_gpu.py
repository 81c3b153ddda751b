"""The Triton kernels on a CUDA GPU with real shapes (bf16), against the PyTorch reference."""

from __future__ import annotations

import pytest

from onnx_fixtures import has


def _cuda() -> bool:
    if not has("torch"):
        return False
    import torch

    return torch.cuda.is_available()


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("s_q,s_k,window,sinks,causal", [(4097, 4097, 1000, 4, True), (3001, 3001, 257, 3, False),
                                                         (1, 5001, 1024, 4, True), (3, 5001, 0, 0, True)])
def test_bf16_real_shapes(s_q, s_k, window, sinks, causal):
    import torch

    import edgeattn.plugins.kernels.torch_ops  # noqa: F401
    from edgeattn.attention.reference import windowed_attention_torch

    torch.manual_seed(0)
    q = torch.randn(2, 16, s_q, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 4, s_k, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out = torch.ops.edgeattn.windowed_attention(q, k, v, torch.tensor(window, device="cuda"), sinks, causal, 0.0, None)
    ref = windowed_attention_torch(q.float(), k.float(), v.float(), window, sinks=sinks, causal=causal)
    assert (out.float() - ref).abs().max().item() <= 2e-2


def test_torch_module_uses_the_kernel_on_cuda_and_hf_swap_runs():
    """The attention module (issue 3) runs the Triton op on CUDA; a swapped HF model agrees with eager."""
    import torch

    from edgeattn.attention.reference import windowed_attention_torch
    from edgeattn.attention.torch_module import windowed_attention

    torch.manual_seed(1)
    q = torch.randn(1, 8, 333, 64, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(1, 2, 333, 64, device="cuda", dtype=torch.float16) for _ in range(2))
    mask = torch.ones(1, 333, dtype=torch.int64, device="cuda")
    mask[0, -7:] = 0
    out = windowed_attention(q, k, v, 64, mask, causal=True, sinks=4)
    ref = windowed_attention_torch(q.float(), k.float(), v.float(), 64, sinks=4, causal=True, key_padding_mask=mask)
    assert (out.float() - ref).abs().max().item() <= 1e-2


@pytest.mark.parametrize("variant", [{}, {"desc": True}, {"desc": True, "fold_scale": True},
                                     {"desc": True, "sink_block": True}, {"desc": True, "persistent": 2},
                                     {"desc": True, "persistent": 2, "edge_masks": True},
                                     {"desc": True, "sink_block": True, "rcp_epilogue": True, "tma_store": True}])
@pytest.mark.parametrize("tile", [(64, 64, 4, 3), (128, 128, 8, 2)])
def test_hopper_prefill_variants_bf16(variant, tile):
    """The sm_90 prefill kernel (prefill_hopper.py, issue 6) on odd lengths, GQA, sinks, padding, both directions."""
    import torch

    from edgeattn.attention.reference import windowed_attention_torch
    from edgeattn.plugins.kernels.dispatch import windowed_prefill

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("tensor descriptors need sm_90+")
    torch.manual_seed(2)
    q = torch.randn(2, 8, 1537, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 1537, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    mask = torch.rand(2, 1537, device="cuda") > 0.2
    for window, sinks, causal, pad in ((300, 4, True, None), (0, 0, True, None), (257, 3, False, mask)):
        out = windowed_prefill(q, k, v, torch.tensor(window, device="cuda"), sinks=sinks, causal=causal,
                               key_padding_mask=pad, tile=tile, hopper=variant)
        ref = windowed_attention_torch(q.float(), k.float(), v.float(), window, sinks=sinks, causal=causal,
                                       key_padding_mask=pad)
        assert (out.float() - ref).abs().max().item() <= 2e-2, (window, sinks, causal)
