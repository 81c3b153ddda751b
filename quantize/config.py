"""Typed quantization configs: frozen, validated on construction, serialisable with a type tag and version.

Configs dispatch through a public registry (the torchao pattern): `register_config` adds a `QuantConfig`
subclass under its `name` (the CLI's `--config` choices are the registry's names), and
`edgeattn.quantize.api.register_handler` says which module replaces a Linear for it (QuantLinear, driven by
the class attributes `weight_format`, `weight_group` and `quantize_inputs`, unless another is registered).
A config is one file: every module in `edgeattn/quantize/configs/` (fp8.py, for one) is imported with this one.
"""

from __future__ import annotations

import fnmatch
import importlib
import pkgutil
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import ClassVar

from edgeattn.errors import ConfigError

OBSERVERS = ("max", "percentile", "mse")
WEIGHT_FORMATS = ("int8", "int4", "fp8")
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


def config_names() -> list[str]:
    """The registered config names, in registration order (the CLI's --config choices)."""
    return list(CONFIGS)


def config_from_name(name: str, **kwargs) -> QuantConfig:
    try:
        cls = CONFIGS[name]
    except KeyError:
        raise ConfigError(f"quantization config: expected one of {', '.join(CONFIGS)}, found {name!r}") from None
    if "block_size" in kwargs and "block_size" not in {f.name for f in fields(cls)}:
        if kwargs["block_size"] is not None:
            with_blocks = [n for n, c in CONFIGS.items() if "block_size" in {f.name for f in fields(c)}]
            raise ConfigError(f"--block-size applies to {', '.join(with_blocks)} only, found it with {name}")
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


def _load_config_files() -> None:
    """Import every module of edgeattn/quantize/configs/: each registers its config(s)."""
    from edgeattn.quantize import configs

    for info in sorted(pkgutil.iter_modules(configs.__path__), key=lambda i: i.name):
        importlib.import_module(f"{configs.__name__}.{info.name}")


_load_config_files()
from edgeattn.quantize.configs.fp8 import FP8Config  # noqa: E402  (registered third: w8a8, w4, fp8)

__all__ = ["LayerOverride", "W8A8Config", "W4Config", "FP8Config", "QuantConfig", "CONFIGS", "WEIGHT_FORMATS",
           "register_config", "config_names", "config_from_name", "config_to_dict", "config_from_dict"]
