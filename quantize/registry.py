"""The base of every quantization config, the registry of configs by name, and the two built-in ones.

`register_config` adds a `QuantConfig` subclass under its `name`; a config file in `edgeattn/quantize/configs/`
imports this module and registers itself, and `edgeattn.quantize.config` (the public face: names, lookup,
serialisation) imports every such file. w8a8 and w4 are defined here, so they are registered first.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, is_dataclass, replace
from typing import ClassVar

from edgeattn.errors import ConfigError

OBSERVERS = ("max", "percentile", "mse")
WEIGHT_FORMATS = ("int8", "int4", "fp8")
BLOCK_SIZES = (32, 64, 128)


def _check_observer(name: str, value: str) -> None:
    if value not in OBSERVERS:
        raise ConfigError(f"{name}: expected one of {', '.join(OBSERVERS)}, found {value!r}")


@dataclass(frozen=True)
class LayerOverride:
    """Per-layer override: Linear layers whose module name matches `pattern` (fnmatch) get `config`,
    or stay in float when `config` is None."""

    pattern: str
    config: "QuantConfig | None" = None

    def __post_init__(self) -> None:
        if not self.pattern:
            raise ConfigError("override pattern: expected a module-name pattern such as '*.output.dense', found ''")


@dataclass(frozen=True)
class QuantConfig:
    """Base of every quantization config: the options shared by all (observers, learned scales, per-layer
    overrides). A subclass sets `name` and how weights and inputs are quantized."""

    name: ClassVar[str] = ""  # the registry key and the --config choice
    weight_format: ClassVar[str] = "int8"  # one of WEIGHT_FORMATS
    quantize_inputs: ClassVar[bool] = True  # also fake-quantize each Linear's input (per tensor)

    weight_observer: str = "max"
    act_observer: str = "percentile"
    percentile: float = 99.99  # for the percentile observer, in percent of |x|
    learn_scales: bool = True  # LSQ: step sizes are trainable parameters
    share_input_quantizers: bool = True  # q/k/v (and gate/up) read one tensor: one activation scale for all
    overrides: tuple[LayerOverride, ...] = ()

    def __post_init__(self) -> None:
        _check_observer("weight_observer", self.weight_observer)
        _check_observer("act_observer", self.act_observer)
        if not 50.0 < self.percentile <= 100.0:
            raise ConfigError(f"percentile: expected 50 < p <= 100, found {self.percentile}")
        if not isinstance(self.overrides, tuple) or not all(isinstance(o, LayerOverride) for o in self.overrides):
            raise ConfigError(f"overrides: expected a tuple of LayerOverride, found {self.overrides!r}")

    def for_layer(self, name: str) -> "QuantConfig | None":
        """The config that applies to the Linear layer `name` (last matching override wins), None = float."""
        chosen: QuantConfig | None = self
        for o in self.overrides:
            if fnmatch.fnmatchcase(name, o.pattern):
                chosen = None if o.config is None else replace(o.config, overrides=())
        return chosen

    @property
    def weight_group(self) -> str | int:
        """'channel' (one scale per output channel) or a block size (one scale per that many inputs)."""
        return "channel"


CONFIGS: dict[str, type[QuantConfig]] = {}  # name -> config class, in registration order


def register_config(cls: type[QuantConfig]) -> type[QuantConfig]:
    """Class decorator: add a frozen QuantConfig subclass to the registry under `cls.name`."""
    if not (isinstance(cls, type) and issubclass(cls, QuantConfig) and is_dataclass(cls)):
        raise ConfigError(f"register_config: expected a QuantConfig dataclass, found {cls!r}")
    if not cls.name or cls.name in CONFIGS and CONFIGS[cls.name] is not cls:
        taken = f", which {CONFIGS[cls.name].__qualname__} has" if cls.name in CONFIGS else ""
        raise ConfigError(f"register_config: expected a new name for {cls.__qualname__}, found {cls.name!r}{taken}")
    if cls.weight_format not in WEIGHT_FORMATS:
        raise ConfigError(f"{cls.__qualname__}.weight_format: expected one of {', '.join(WEIGHT_FORMATS)}, "
                          f"found {cls.weight_format!r}")
    CONFIGS[cls.name] = cls
    return cls


@register_config
@dataclass(frozen=True)
class W8A8Config(QuantConfig):
    """INT8 weights (per output channel, symmetric) and INT8 activations (per tensor, symmetric)."""

    name = "w8a8"


@register_config
@dataclass(frozen=True)
class W4Config(QuantConfig):
    """INT4 block-wise weight-only (symmetric, one scale per `block_size` inputs of each output channel)."""

    name = "w4"
    weight_format = "int4"
    quantize_inputs = False
    block_size: int = 32
    weight_observer: str = "mse"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.block_size not in BLOCK_SIZES:
            raise ConfigError(f"block_size: expected one of {', '.join(map(str, BLOCK_SIZES))}, found {self.block_size}")

    @property
    def weight_group(self) -> int:
        return self.block_size
