"""Policy files: TOML (tomllib), YAML (PyYAML, when installed) or JSON; flat keys or a [policy] table.

    kind = "step"                     kind = "predictive"
    levels = [1.0, 0.5, 0.25]         r_c_per_w = 2.0
    thresholds_c = [75, 85]           tau_s = 120.0
    hysteresis_c = 3                  margin_c = 6 ...
    min_hold_s = 10
    budget = {recent = 0.25}          (optional, either kind: the split of each level's rows between the
                                       recent window and retrieval pages; without it, the window alone)
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from edgeattn import atomic
from edgeattn.errors import ConfigError, InputError
from edgeattn.optional import require
from edgeattn.runtime.thermal.policies import BudgetSplit, Policy, PredictivePolicy, StepPolicy

KINDS: dict[str, type] = {"step": StepPolicy, "predictive": PredictivePolicy}


def _text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"policy {path}: expected a UTF-8 text file (TOML, YAML or JSON), found a byte "
                         f"0x{exc.object[exc.start]:02x} at offset {exc.start} that is not UTF-8 text "
                         f"(a binary file?)") from None


def _parse(path: Path) -> dict:
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".yaml", ".yml", ".json"):
        raise InputError(f"policy {path}: expected a .toml, .yaml/.yml or .json file, "
                         f"found {suffix or 'no suffix'!r}")
    text = _text(path)
    errors: tuple = (ValueError,)  # tomllib.TOMLDecodeError and json.JSONDecodeError are ValueErrors
    if suffix == ".toml":
        import tomllib

        parse = tomllib.loads
    elif suffix == ".json":
        parse = json.loads
    else:
        yaml = require("yaml", "reading YAML policy files (pip install pyyaml)")
        parse, errors = (lambda t: yaml.safe_load(t) or {}), (ValueError, yaml.YAMLError)
    try:
        return parse(text)
    except errors as exc:
        raise InputError(f"policy {path}: cannot parse: {' '.join(str(exc).split())}") from None


def policy_from_dict(data: dict, source: str = "policy") -> Policy:
    table = data.get("policy", data) if isinstance(data, dict) else data
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: expected keys (kind = ..., flat or in a [policy] table), "
                          f"found {type(table).__name__} {str(table)[:60]!r}")
    data = dict(table)
    kind = data.pop("kind", None)
    if kind not in KINDS:
        raise ConfigError(f"{source}: expected kind = one of {', '.join(KINDS)}, found {kind!r}")
    cls = KINDS[kind]
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{source}: unknown keys for a {kind} policy: {', '.join(unknown)} (known: {', '.join(sorted(names))})")
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [n for n in required if n not in data]
    if missing:
        raise ConfigError(f"{source}: a {kind} policy needs {', '.join(required)}, found no {', '.join(missing)}")
    for key in ("levels", "thresholds_c"):
        if isinstance(data.get(key), list):
            data[key] = tuple(data[key])  # the policy checks that they are numbers
    if "budget" in data:
        data["budget"] = _budget_split(data["budget"], source)
    try:
        return cls(**data)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _budget_split(value, source: str) -> BudgetSplit:
    names = [f.name for f in dataclasses.fields(BudgetSplit)]
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: budget: expected a table such as {{recent = 0.25}} (keys {', '.join(names)}), "
                          f"found {type(value).__name__} {str(value)[:60]!r}")
    unknown = sorted(set(value) - set(names))
    if unknown:
        raise ConfigError(f"{source}: budget: unknown keys {', '.join(map(str, unknown))} (known: {', '.join(names)})")
    try:
        return BudgetSplit(**value)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def load_policy(path: Path) -> Policy:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"policy {path}: file not found")
    return policy_from_dict(_parse(path), str(path))


def policy_to_dict(policy: Policy) -> dict:
    """The policy's keys; `budget` only when it is not the window alone (so window policies read as before)."""
    data = {"kind": policy.kind, **dataclasses.asdict(policy)}
    if policy.budget == BudgetSplit():
        del data["budget"]
    return data


def _toml_value(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(float(value)) if isinstance(value, float) else str(value)


def save_policy(policy: Policy, path: Path, comment: str = "") -> None:
    """Write TOML (or JSON for a .json path) atomically."""
    path = Path(path)
    data = policy_to_dict(policy)
    if path.suffix.lower() == ".json":
        atomic.write_text(path, json.dumps(data, indent=2) + "\n")
        return
    lines = [f"# {line}" for line in comment.splitlines()] + [f"{k} = {_toml_value(v)}" for k, v in data.items()]
    atomic.write_text(path, "\n".join(lines) + "\n")
