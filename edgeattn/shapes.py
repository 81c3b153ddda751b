"""Shape ranges for dynamic axes: min / opt / max per named dimension."""

from __future__ import annotations

from dataclasses import dataclass

from edgeattn.errors import ConfigError
from edgeattn.onnx_model import Signature

Range = tuple[int, int, int]


def parse_range(text: str, what: str) -> Range:
    """'8' -> (8, 8, 8); '1:8' -> (1, 8, 8); '1:4:8' -> (1, 4, 8)."""
    try:
        parts = [int(p) for p in str(text).split(":")]
    except ValueError:
        raise ConfigError(f"{what}: expected N or MIN:OPT:MAX with integers, found {text!r}") from None
    if len(parts) == 1:
        parts = parts * 3
    elif len(parts) == 2:
        parts = [parts[0], parts[1], parts[1]]
    elif len(parts) != 3:
        raise ConfigError(f"{what}: expected N or MIN:OPT:MAX, found {text!r}")
    return check_range(tuple(parts), what)  # type: ignore[arg-type]


def check_range(r: Range, what: str) -> Range:
    lo, opt, hi = r
    if not 1 <= lo <= opt <= hi:
        raise ConfigError(f"{what}: expected 1 <= min <= opt <= max, found {lo}:{opt}:{hi}")
    return (int(lo), int(opt), int(hi))


@dataclass(frozen=True)
class ShapePlan:
    """Which dynamic dimension is batch and which is sequence, and their ranges."""

    ranges: dict[str, Range]
    kinds: dict[str, str]  # dim name -> "batch" | "seq" | "cache" | "other"

    def at(self, which: str) -> dict[str, int]:
        """Concrete sizes at 'min', 'opt' or 'max'."""
        i = {"min": 0, "opt": 1, "max": 2}[which]
        return {name: r[i] for name, r in self.ranges.items()}


def plan(signature: Signature, batch: Range, seq: Range, overrides: dict[str, Range] | None = None,
         derived: dict[str, tuple[Range, str]] | None = None) -> ShapePlan:
    """Give every dynamic dimension a range: dim 0 is batch, the others are sequence, unless overridden.

    `derived`: dimensions whose range and kind the model itself says (a decoder's cache rows: sinks + its
    ring), used unless `overrides` names them too."""
    overrides = overrides or {}
    derived = derived or {}
    ranges: dict[str, Range] = {}
    kinds: dict[str, str] = {}
    for spec in signature.inputs:
        for axis, dim in enumerate(spec.dims):
            if not isinstance(dim, str) or dim in ranges:
                continue
            kind = "batch" if axis == 0 else "seq"
            if dim in overrides:
                kinds[dim], ranges[dim] = "other", overrides[dim]
            elif dim in derived:
                ranges[dim], kinds[dim] = derived[dim]
            else:
                kinds[dim], ranges[dim] = kind, batch if kind == "batch" else seq
    unknown = set(overrides) - set(ranges)
    if unknown:
        raise ConfigError(f"shape override for unknown dimension(s) {sorted(unknown)}: the model's dynamic "
                          f"dimensions are {sorted(ranges) or 'none'}")
    return ShapePlan(ranges, kinds)
