"""Typed quantization configs: frozen, validated on construction, serialisable with a type tag and version.

Configs dispatch through a public registry (the torchao pattern): `register_config` adds a `QuantConfig`
subclass under its `name` (the CLI's `--config` choices are the registry's names), and
`edgeattn.quantize.api.register_handler` says which module replaces a Linear for it (QuantLinear, driven by
the class attributes `weight_format`, `weight_group` and `quantize_inputs`, unless another is registered).
A config is one file: every module in `edgeattn/quantize/configs/` (fp8.py, for one) is imported with this one.
The base class, the registry and the built-in w8a8 and w4 are in `edgeattn.quantize.registry`.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import fields

from edgeattn.errors import ConfigError
from edgeattn.quantize import configs
from edgeattn.quantize.registry import (CONFIGS, WEIGHT_FORMATS, LayerOverride, QuantConfig, W4Config, W8A8Config,
                                        register_config)

CONFIG_VERSION = 1


def _load_config_files() -> None:
    """Import every module of edgeattn/quantize/configs/: each registers its config(s)."""
    for info in sorted(pkgutil.iter_modules(configs.__path__), key=lambda i: i.name):
        importlib.import_module(f"{configs.__name__}.{info.name}")


_load_config_files()
from edgeattn.quantize.configs.fp8 import FP8Config  # noqa: E402  (registered third: w8a8, w4, fp8)


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


__all__ = ["LayerOverride", "W8A8Config", "W4Config", "FP8Config", "QuantConfig", "CONFIGS", "WEIGHT_FORMATS",
           "register_config", "config_names", "config_from_name", "config_to_dict", "config_from_dict"]
