"""edgeattn.quantize: quantization-aware training (INT8, INT4, FP8) and 2:4 sparsity.

    from edgeattn.quantize import W8A8Config, quantize_, calibrate, distill, DistillConfig, export_qdq, text
    teacher = copy.deepcopy(model)
    quantize_(model, W8A8Config())          # Linear -> QuantLinear (fake quant, learned step sizes)
    calibrate(model, batches)               # observers set the initial step sizes
    distill(model, teacher, text.sampled_batches(examples, 16), kind, DistillConfig(steps=200))
    export_qdq(model, kind, "model.qdq.onnx")

Configs dispatch through a registry (`register_config`, `register_handler`); `edgeattn.text` holds
all text handling, `edgeattn.quantize.distillation` the one training loop (QAT and the 2:4 fine-tune).

Heavy imports (torch) happen when a name is first used, so importing this package stays light.
"""

if __name__ != "edgeattn.quantize":  # the folder is installed as edgeattn.quantize; a bare import is a mistake
    raise ImportError(f"import this package as 'edgeattn.quantize', not as {__name__!r}")

import importlib

_EXPORTS = {
    "W8A8Config": "config", "W4Config": "config", "FP8Config": "config", "LayerOverride": "config",
    "QuantConfig": "config", "CONFIGS": "config", "config_from_name": "config", "config_to_dict": "config",
    "config_from_dict": "config", "register_config": "config", "config_names": "config",
    "quantize_": "api", "calibrate": "api", "QuantizeReport": "api", "HANDLERS": "api", "quant_linears": "api",
    "scale_parameters": "api", "register_handler": "api", "handler_for": "api",
    "QuantLinear": "qlinear", "FakeQuantizer": "fake_quant",
    "distill": "distillation", "DistillConfig": "distillation", "DistillResult": "distillation",
    "sparsity_finetune": "distillation", "init_distributed": "distillation",
    "pool": "distillation", "export_qdq": "qdq_export", "qdq_summary": "qdq_export",
    "QuantizeJob": "pipeline", "QuantizeResult": "pipeline", "run_quantize": "pipeline",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'edgeattn.quantize' has no attribute {name!r}")
    return getattr(importlib.import_module(f"edgeattn.quantize.{_EXPORTS[name]}"), name)
