"""Recipe tables -> frozen config dataclasses, generically: keys checked against the dataclass fields.

A stage's options are the fields of the config its stage function takes (`ExportConfig`, `SparsifyJob`,
`QuantizeJob`, `BuildConfig`, `TritonConfig`), so a field added there is an option here with no change.
Values are converted by the field's annotation: TOML arrays to tuples, tables to nested configs (or to
tuples of pairs), relative paths against the recipe's folder, integers to floats. A key that is not a
field, or a value of the wrong type, is a ConfigError that names the file, the stage and the key.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

from edgeattn.errors import ConfigError

def option_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.init]


def check_keys(table: dict, allowed: typing.Iterable[str], where: str) -> None:
    allowed = sorted(set(allowed))
    for key in table:
        if key not in allowed:
            raise ConfigError(f"{where}: unknown option {key!r}: expected one of {', '.join(allowed)}")


def from_table(cls: type, table: dict, where: str, base: Path, *, fixed: dict | None = None,
               refused: typing.Iterable[str] = ()) -> Any:
    """`cls(**converted table, **fixed)`; `refused` fields are set by the pipeline, never by a recipe."""
    fixed = dict(fixed or {})
    refused = set(refused) | set(fixed)
    check_keys(table, set(option_names(cls)) - refused, where)
    hints = typing.get_type_hints(cls)
    kwargs = {key: convert(hints[key], value, f"{where}: {key}", base) for key, value in table.items()}
    try:
        return cls(**kwargs, **fixed)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _is_union(tp) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def convert(tp, value, where: str, base: Path):
    """Convert one TOML value to the annotation `tp`, or raise ConfigError naming `where`."""
    if tp is Any or tp is object:
        return value
    if _is_union(tp):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        errors = []
        for option in options:
            try:
                return convert(option, value, where, base)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[-1] if len(options) == 1 else ConfigError(
            f"{where}: expected {' or '.join(_type_name(o) for o in options)}, found {_found(value)}")
    origin = typing.get_origin(tp) or tp
    if dataclasses.is_dataclass(origin) and isinstance(origin, type):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table of {origin.__name__} options, found {_found(value)}")
        return from_table(origin, value, where, base)
    if origin is tuple:
        return _tuple(tp, value, where, base)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, found {_found(value)}")
        return dict(value)
    if origin is Path:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where}: expected a path (a string), found {_found(value)}")
        return resolve_path(value, base)
    if origin is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, found {_found(value)}")
        return value
    if origin is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, found {_found(value)}")
        return value
    if origin is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, found {_found(value)}")
        return float(value)
    if origin is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, found {_found(value)}")
        return value
    raise ConfigError(f"{where}: this option ({_type_name(tp)}) cannot be set from a recipe")


def _tuple(tp, value, where: str, base: Path) -> tuple:
    args = typing.get_args(tp)
    if isinstance(value, dict) and args and typing.get_origin(args[0]) is tuple:  # tuple of (name, value) pairs
        value = [[k, v] for k, v in value.items()]
    if not isinstance(value, list):
        raise ConfigError(f"{where}: expected an array, found {_found(value)}")
    if not args:
        return tuple(value)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(convert(args[0], v, f"{where}[{i}]", base) for i, v in enumerate(value))
    if len(value) != len(args):
        raise ConfigError(f"{where}: expected an array of {len(args)} values, found {len(value)}")
    return tuple(convert(a, v, f"{where}[{i}]", base) for i, (a, v) in enumerate(zip(args, value)))


def resolve_path(value: str, base: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else Path(base) / path


def _found(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}"
