"""Distillation QAT: it lowers the loss, resumes from checkpoints, and 2 DDP processes match 1."""

from __future__ import annotations

import copy
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from edgeattn.errors import ConfigError
from edgeattn.quantize import DistillConfig, W8A8Config, W4Config, calibrate, distill, quantize_
from edgeattn.text import sampled_batches
from quant_models import tiny_bert, tiny_llama, token_batch


def _prepared(make, config, seed=0):
    model = make(seed)
    teacher = copy.deepcopy(model)
    quantize_(model, config)
    calibrate(model, [token_batch(8, 12, seed=1)])
    return model, teacher


@pytest.mark.parametrize("make,kind,config,lr,coarse", [(tiny_bert, "encoder", W8A8Config(), 1e-5, 16.0),
                                                        (tiny_llama, "decoder", W4Config(block_size=32), 1e-4, 4.0)])
def test_distillation_lowers_the_loss_against_the_teacher(make, kind, config, lr, coarse):
    from edgeattn.quantize.api import scale_parameters

    model, teacher = _prepared(make, config)
    with torch.no_grad():  # start from step sizes too coarse, so there is error for the training to remove
        for log_scale in scale_parameters(model):
            log_scale.add_(math.log(coarse))
    examples = token_batch(16, 12, seed=2)
    losses = distill(model, teacher, sampled_batches(examples, 16), kind,
                     DistillConfig(steps=15, lr=lr, scale_lr=1e-2, progress=False)).losses
    assert sum(losses[-3:]) / 3 < 0.85 * losses[0]


def test_checkpoints_resume_where_they_stopped(tmp_path):
    examples = token_batch(16, 12, seed=2)
    cfg = dict(lr=1e-3, scale_lr=1e-2, progress=False, checkpoint_every=2)
    full, teacher = _prepared(tiny_bert, W8A8Config())
    distill(full, teacher, sampled_batches(examples, 8), "encoder", DistillConfig(steps=4, **cfg))

    part, teacher = _prepared(tiny_bert, W8A8Config())
    distill(part, teacher, sampled_batches(examples, 8), "encoder",
            DistillConfig(steps=2, checkpoint_dir=tmp_path, **cfg))
    resumed, teacher = _prepared(tiny_bert, W8A8Config())  # a fresh process would start like this
    losses = distill(resumed, teacher, sampled_batches(examples, 8), "encoder",
                     DistillConfig(steps=4, checkpoint_dir=tmp_path, **cfg)).losses
    assert len(losses) == 2  # steps 3 and 4 only
    for (name, a), b in zip(full.state_dict().items(), resumed.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name


def test_batch_must_split_evenly_and_fit_the_data():
    model, teacher = _prepared(tiny_bert, W8A8Config())
    with pytest.raises(Exception, match="at least batch_size=64"):
        distill(model, teacher, sampled_batches(token_batch(8, 12), 64), "encoder",
                DistillConfig(steps=1, progress=False))
    with pytest.raises(ConfigError, match="steps"):
        DistillConfig(steps=-1)


@pytest.mark.slow
def test_two_ddp_processes_match_one_at_equal_global_batch(tmp_path):
    script = Path(__file__).parent / "quant_ddp_run.py"
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    subprocess.run([sys.executable, str(script), str(one)], check=True, timeout=300)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517",
                    str(script), str(two)], check=True, timeout=300)
    a, b = torch.load(one), torch.load(two)
    assert a["world"] == 1 and b["world"] == 2
    # Adam's first steps are nearly sign(grad): float summation order may flip a near-zero component, so
    # compare each tensor's disagreement with how far training moved it
    # (the key bias has zero gradient: softmax ignores it; it moves by noise only and is not compared)
    checked = 0
    for name, t in a["state"].items():
        moved = (t - a["init"][name]).norm()
        if moved > 1e-5:
            assert (t - b["state"][name]).norm() <= 0.02 * moved, name
            checked += 1
    assert checked > len(a["state"]) // 2
    moved = [k for k in a["state"] if k.endswith("log_scale") and not torch.allclose(a["state"][k], a["init"][k])]
    assert moved  # the learned step sizes did train, and both runs agree on them


def test_sibling_layers_share_one_activation_quantizer():
    from edgeattn.quantize.api import quantizers

    model = tiny_bert(0)
    report = quantize_(model, W8A8Config())
    attn = model.encoder.layer[0].attention.self
    assert attn.query.input_quantizer is attn.key.input_quantizer is attn.value.input_quantizer
    assert len(report.shared_inputs) == len(model.encoder.layer)
    assert len({id(q) for q in quantizers(model)}) == len(list(quantizers(model)))  # each quantizer once
    alone = tiny_bert(0)
    quantize_(alone, W8A8Config(share_input_quantizers=False))
    assert alone.encoder.layer[0].attention.self.query.input_quantizer is not \
        alone.encoder.layer[0].attention.self.key.input_quantizer
