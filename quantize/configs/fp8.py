"""fp8: FP8 E4M3 weights (per output channel) and activations (per tensor), for targets with FP8 (h100, thor).

A config is this one file: the class, registered by name; QuantLinear quantizes any QuantConfig from its
class attributes, so no handler is needed here (`edgeattn.quantize.api.register_handler` adds one when a
config needs a module of its own)."""

from __future__ import annotations

from dataclasses import dataclass

from edgeattn.quantize.registry import QuantConfig, register_config


@register_config
@dataclass(frozen=True)
class FP8Config(QuantConfig):
    """FP8 E4M3 weights (per output channel) and activations (per tensor)."""

    name = "fp8"
    weight_format = "fp8"
    act_observer: str = "max"
