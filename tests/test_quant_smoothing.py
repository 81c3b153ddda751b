"""SmoothQuant-style scaling: exact in float, found on Llama-family blocks, keeps 2:4 zeros, validated."""

import copy

import pytest
import torch

from edgeattn.errors import ConfigError
from edgeattn.quantize.smoothing import SmoothConfig, find_groups, smooth_
from quant_models import tiny_bert, tiny_llama, token_batch


def test_smoothing_keeps_the_float_function():
    model = tiny_llama(0)
    with torch.no_grad():  # give the down-projection input an outlier channel worth moving
        model.model.layers[0].mlp.up_proj.weight[5] *= 40
    batch = token_batch(4, 12, seed=3)
    ref = model(**batch).logits
    smoothed = copy.deepcopy(model)
    report = smooth_(smoothed, [token_batch(8, 12, seed=1)], SmoothConfig(alpha=0.85))
    assert len(report.smoothed) == 2 * 7  # per layer: q, k, v, o, gate, up, down
    torch.testing.assert_close(smoothed(**batch).logits, ref, atol=2e-4, rtol=1e-4)
    assert report.max_scale > 1.0 and "lm_head" in report.skipped
    changed = smoothed.model.layers[0].mlp.down_proj.weight
    assert not torch.equal(changed, model.model.layers[0].mlp.down_proj.weight)


def test_groups_of_a_llama_block_and_none_for_bert():
    kinds = sorted((g.kind, len(g.consumers)) for g in find_groups(tiny_llama(0)) if ".layers.0." in g.producer)
    assert kinds == [("linear_rows", 1), ("norm", 2), ("norm", 3), ("v_to_o", 1)]
    report = smooth_(tiny_bert(0), [token_batch(2, 8)], SmoothConfig())
    assert not report.smoothed and report.skipped


def test_smoothing_keeps_two_four_zeros():
    from edgeattn.quantize.sparsity.masks import SparsityConfig, is_two_four, masked_layers, sparsify_

    model = tiny_llama(0)
    sparsify_(model, SparsityConfig(policy="all", method="magnitude"))
    smooth_(model, [token_batch(4, 12, seed=1)], SmoothConfig(alpha=0.5))
    assert all(is_two_four(m.weight) for m in masked_layers(model).values())


@pytest.mark.parametrize("kwargs", [{"alpha": 1.5}, {"alpha": -0.1}, {"calib_batches": 0}])
def test_bad_config(kwargs):
    with pytest.raises(ConfigError):
        SmoothConfig(**kwargs)


def test_quantize_job_checks_the_alpha(tmp_path):
    from edgeattn.quantize import W8A8Config
    from edgeattn.quantize.pipeline import QuantizeJob

    with pytest.raises(ConfigError, match="smooth_alpha"):
        QuantizeJob("minilm", W8A8Config(), tmp_path / "m.onnx", smooth_alpha=1.5)
