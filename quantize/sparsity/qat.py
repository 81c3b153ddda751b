"""2:4 then QAT: quantize a pruned model with edgeattn.quantize (issue 4), keeping the masks.

The masks are parametrizations on `Linear.weight`; `quantize_` wraps each Linear in a QuantLinear that
reads `linear.weight` through them, so the fake-quantized weight keeps its zeros (symmetric quantization
maps 0 to 0) and the masked entries get zero gradient during distillation. The exported int8 weight
behind DequantizeLinear holds the same zeros, which the graph check verifies.
"""

from __future__ import annotations

from typing import Any

from edgeattn import text
from edgeattn.optional import require
from edgeattn.quantize.config import W8A8Config, config_to_dict
from edgeattn.quantize.distillation import DistillConfig, distill
from edgeattn.quantize.sparsity.two_four import is_two_four, masked_layers


def qat_after_sparsity(student, teacher, tokenizer, kind: str, texts: list[str], steps: int, *, config=None,
                       batch_size: int = 16, seq_len: int = 64, calib_batches: int = 8, lr: float = 1e-5,
                       progress=lambda msg: None) -> dict[str, Any]:
    """quantize_ (W8A8 unless `config`) -> calibrate -> distil, in place on the pruned `student`; `progress`
    gets the QAT steps (`StepProgress`)."""
    require("torch", "QAT")
    from edgeattn.quantize.api import calibrate, quantize_  # loads torch

    masked = len(masked_layers(student))
    config = config or W8A8Config()
    report = quantize_(student, config)
    examples = text.padded_examples(tokenizer, texts, kind, seq_len)
    calibrate(student, text.leading_batches(examples, batch_size, calib_batches))
    losses = distill(student, teacher, text.sampled_batches(examples, batch_size), kind,
                     DistillConfig(steps=steps, lr=lr, progress=False), log=progress, task="QAT").losses if steps else []
    after = masked_layers(student)
    return {"config": config_to_dict(config), "layers": report.as_dict(), "steps": steps,
            "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
            "masks_kept": len(after) == masked and all(is_two_four(m.weight) for m in after.values())}
