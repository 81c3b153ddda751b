"""Example recipes for `edgeattn pipeline` (package data): `edgeattn pipeline NAME` runs one by name."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from edgeattn.errors import InputError


def names() -> list[str]:
    return sorted(p.name.removesuffix(".toml") for p in resources.files(__name__).iterdir()
                  if p.name.endswith(".toml"))


def find(name: str) -> Path:
    """The path of the packaged recipe `name` (with or without .toml)."""
    path = Path(str(resources.files(__name__) / f"{name.removesuffix('.toml')}.toml"))
    if not path.is_file():
        raise InputError(f"recipe {name!r}: expected a .toml file or a packaged recipe "
                         f"({', '.join(names())}), found neither")
    return path
