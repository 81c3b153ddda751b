"""QAT and 2:4 masks on a CUDA GPU (run on the lent H200): the same API, the same guarantees."""

from __future__ import annotations

import copy

import pytest

from onnx_fixtures import has


def _cuda() -> bool:
    if not has("torch"):
        return False
    import torch

    return torch.cuda.is_available()


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")]


def test_qat_on_cuda_keeps_two_four_zeros_and_exports(tmp_path):
    import onnx
    import torch

    from edgeattn.quantize import DistillConfig, W8A8Config, calibrate, distill, quantize_
    from edgeattn.quantize.api import scale_parameters
    from edgeattn.quantize.qdq_export import export_qdq
    from edgeattn.quantize.sparsity.masks import SparsityConfig, is_two_four, masked_layers, sparsify_
    from edgeattn.text import sampled_batches
    from quant_models import tiny_bert, token_batch

    model = tiny_bert(0)
    teacher = copy.deepcopy(model)
    sparsify_(model, SparsityConfig(policy="all", method="magnitude"))
    quantize_(model, W8A8Config())
    calibrate(model, [token_batch(8, 12, seed=1)])
    with torch.no_grad():
        for log_scale in scale_parameters(model):
            log_scale.add_(1.3863)  # 4x too coarse: something to learn
    losses = distill(model, teacher, sampled_batches(token_batch(32, 12, seed=2), 16), "encoder",
                     DistillConfig(steps=30, lr=1e-5, scale_lr=1e-2, device="cuda", progress=False)).losses
    assert next(model.parameters()).is_cuda
    assert sum(losses[-3:]) / 3 < 0.85 * losses[0]
    assert all(is_two_four(m.weight) for m in masked_layers(model).values())
    model.cpu()
    export_qdq(model, "encoder", tmp_path / "q.onnx")
    ops = {n.op_type for n in onnx.load(str(tmp_path / "q.onnx")).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "MatMul"} <= ops


@pytest.mark.parametrize("method", ["calibrated", "sequential"])
def test_calibrated_pruning_on_cuda_matches_the_cpu(method):
    """Grams, OBS updates and (sequential) block re-runs on the GPU give the CPU's masks and weights."""
    import torch

    from edgeattn.quantize.sparsity.masks import SparsityConfig, is_two_four, masked_layers, sparsify_
    from tests.quant_models import tiny_llama, token_batch

    torch.backends.cuda.matmul.allow_tf32 = False
    calib = [token_batch(4, 16, seed=s) for s in range(3)]
    cpu, gpu = tiny_llama(), tiny_llama().cuda()
    sparsify_(cpu, SparsityConfig(method=method), calibration=calib)
    sparsify_(gpu, SparsityConfig(method=method), calibration=calib)
    a, b = masked_layers(cpu), masked_layers(gpu)
    assert set(a) == set(b) and len(a) == 15
    for name in a:
        wa, wb = a[name].weight, b[name].weight
        assert wb.is_cuda and is_two_four(wb.cpu())
        agree = ((wa != 0) == (wb.cpu() != 0)).float().mean().item()
        assert agree > 0.99, f"{name}: masks agree on {agree:.3f} of the weights"
        rel = ((wb.cpu() - wa).norm() / wa.norm()).item()
        assert rel < 1e-2, f"{name}: GPU weights differ from the CPU's by {rel:.2e} (relative)"
