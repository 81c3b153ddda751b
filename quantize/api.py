"""quantize_ (prepare: insert fake quantizers) and calibrate (observers -> initial step sizes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
from torch import nn

from edgeattn.errors import ConfigError
from edgeattn.quantize.config import QuantConfig
from edgeattn.quantize.qlinear import QuantLinear


@dataclass
class QuantizeReport:
    """What quantize_ did: which Linear layers got which config, and which stayed in float (and why)."""

    config: str
    quantized: dict[str, str] = field(default_factory=dict)  # module name -> config name
    float_layers: dict[str, str] = field(default_factory=dict)  # module name -> reason
    shared_inputs: list[list[str]] = field(default_factory=list)  # layers that share one activation quantizer

    def as_dict(self) -> dict:
        return {"config": self.config, "quantized": self.quantized, "float_layers": self.float_layers,
                "shared_inputs": self.shared_inputs}


Handler = Callable[[nn.Linear, QuantConfig], nn.Module]

# The config's type selects the handler (torchao style): the nearest registered class in its MRO.
# QuantLinear serves every QuantConfig; a config that needs another module registers its own.
HANDLERS: dict[type, Handler] = {QuantConfig: QuantLinear}


def register_handler(config_type: type) -> Callable[[Handler], Handler]:
    """Decorator: `handler(linear, config) -> module` replaces each Linear quantized with `config_type`."""
    if not (isinstance(config_type, type) and issubclass(config_type, QuantConfig)):
        raise ConfigError(f"register_handler: expected a QuantConfig subclass, found {config_type!r}")

    def add(handler: Handler) -> Handler:
        HANDLERS[config_type] = handler
        return handler

    return add


def handler_for(config: QuantConfig) -> Handler:
    for cls in type(config).__mro__:
        if cls in HANDLERS:
            return HANDLERS[cls]
    raise ConfigError(f"no quantization handler for {type(config).__name__}: expected a QuantConfig subclass "
                      f"(register one with register_handler)")


def _is_linear(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) and not isinstance(module, QuantLinear)


def check_config(model: nn.Module, config: QuantConfig) -> None:
    """Raise ConfigError for a layer the config cannot quantize (before any module is replaced)."""
    handler_for(config)
    for name, module in model.named_modules():
        if not _is_linear(module):
            continue
        layer = config.for_layer(name)
        if layer is None:
            continue
        handler_for(layer)
        group = layer.weight_group
        if isinstance(group, int) and module.in_features % group:
            raise ConfigError(f"block size {group} does not divide the input dimension of {name} "
                              f"({module.in_features}); expected a divisor such as 32, 64 or 128")


def quantize_(model: nn.Module, config: QuantConfig) -> QuantizeReport:
    """Replace every Linear of `model` (in place) with a QuantLinear per `config` and its overrides."""
    check_config(model, config)
    report = QuantizeReport(config.name)
    targets = [(name, m) for name, m in model.named_modules() if _is_linear(m)]
    for name, linear in targets:
        layer = config.for_layer(name)
        if layer is None:
            report.float_layers[name] = "override: kept in float"
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, handler_for(layer)(linear, layer))
        report.quantized[name] = layer.name
    if config.share_input_quantizers:
        report.shared_inputs = share_input_quantizers(model)
    return report


# Sibling Linears that read the same activation (by module name): one input quantizer serves them all,
# so the exported graph quantizes that tensor once (and ONNX Runtime's cpu lowering runs one QuantizeLinear).
SHARED_INPUT_GROUPS = (("query", "key", "value"), ("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def share_input_quantizers(model: nn.Module) -> list[list[str]]:
    """Give each group of sibling QuantLinears (SHARED_INPUT_GROUPS) one activation quantizer; returns the groups."""
    shared = []
    for parent_name, parent in model.named_modules():
        for names in SHARED_INPUT_GROUPS:
            members = [getattr(parent, n, None) for n in names]
            if not all(isinstance(m, QuantLinear) and m.input_quantizer is not None for m in members):
                continue
            if len({(m.fmt, type(m.config)) for m in members}) != 1:
                continue
            for m in members[1:]:
                m.input_quantizer = members[0].input_quantizer
            shared.append([f"{parent_name}.{n}" if parent_name else n for n in names])
    return shared


def quant_linears(model: nn.Module) -> list[tuple[str, QuantLinear]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, QuantLinear)]


def quantizers(model: nn.Module):
    """Every fake quantizer once (an input quantizer can be shared by sibling layers)."""
    seen = set()
    for _, m in quant_linears(model):
        for q in (m.weight_quantizer, m.input_quantizer):
            if q is not None and id(q) not in seen:
                seen.add(id(q))
                yield q


@torch.no_grad()
def calibrate(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]]) -> int:
    """Run `batches` (model keyword inputs) through the model with observers on; set initial scales.

    Returns the number of batches seen. Weights are observed on the first batch."""
    qs = list(quantizers(model))
    if not qs:
        raise ConfigError("calibrate: the model has no quantized layers; call quantize_ first")
    for q in qs:
        q.calibrating, q.calibrated = True, False
    was_training = model.training
    model.eval()
    n = 0
    for batch in batches:
        model(**batch)
        n += 1
    if n == 0:
        raise ConfigError("calibrate: expected at least one calibration batch, found none")
    for q in qs:
        q.finish_calibration()
    model.train(was_training)
    return n


def scale_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [q.log_scale for q in quantizers(model) if q.log_scale.requires_grad]
