"""Typed quantization configs: frozen, validated on construction, serialisable with a type tag and version."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, fields, replace

from edgeattn.errors import ConfigError

OBSERVERS = ("max", "percentile", "mse")
BLOCK_SIZES = (32, 64, 128)
CONFIG_VERSION = 1


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
class _Base:
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


@dataclass(frozen=True)
class W8A8Config(_Base):
    """INT8 weights (per output channel, symmetric) and INT8 activations (per tensor, symmetric)."""

    name = "w8a8"


@dataclass(frozen=True)
class W4Config(_Base):
    """INT4 block-wise weight-only (symmetric, one scale per `block_size` inputs of each output channel)."""

    name = "w4"
    block_size: int = 32
    weight_observer: str = "mse"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.block_size not in BLOCK_SIZES:
            raise ConfigError(f"block_size: expected one of {', '.join(map(str, BLOCK_SIZES))}, found {self.block_size}")


@dataclass(frozen=True)
class FP8Config(_Base):
    """FP8 E4M3 weights (per output channel) and activations (per tensor); for targets with FP8 (h100, thor)."""

    name = "fp8"
    act_observer: str = "max"


QuantConfig = W8A8Config | W4Config | FP8Config
CONFIGS: dict[str, type] = {"w8a8": W8A8Config, "w4": W4Config, "fp8": FP8Config}


def config_from_name(name: str, **kwargs) -> QuantConfig:
    try:
        cls = CONFIGS[name]
    except KeyError:
        raise ConfigError(f"quantization config: expected one of {', '.join(CONFIGS)}, found {name!r}") from None
    if "block_size" in kwargs and cls is not W4Config:
        if kwargs["block_size"] is not None:
            raise ConfigError(f"--block-size applies to w4 only, found it with {name}")
        kwargs.pop("block_size")
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    return cls(**kwargs)


def config_to_dict(config: QuantConfig) -> dict:
    d = {f.name: getattr(config, f.name) for f in fields(config) if f.name != "overrides"}
    d["overrides"] = [{"pattern": o.pattern, "config": None if o.config is None else config_to_dict(o.config)}
                      for o in config.overrides]
    return {"type": config.name, "version": CONFIG_VERSION, **d}


def config_from_dict(data: dict) -> QuantConfig:
    data = dict(data)
    if data.pop("version", None) != CONFIG_VERSION:
        raise ConfigError(f"quantization config version: expected {CONFIG_VERSION}")
    kind = data.pop("type", None)
    overrides = tuple(LayerOverride(o["pattern"], None if o["config"] is None else config_from_dict(o["config"]))
                      for o in data.pop("overrides", []))
    return config_from_name(kind, overrides=overrides, **data)


__all__ = ["LayerOverride", "W8A8Config", "W4Config", "FP8Config", "QuantConfig", "CONFIGS",
           "config_from_name", "config_to_dict", "config_from_dict"]
