"""TensorRT optimization profiles from the manifest's shape ranges, split where a range is wide."""

from __future__ import annotations

import itertools
import math

from edgeattn.onnx_model import TensorSpec
from edgeattn.shapes import Range, ShapePlan

WIDE_RATIO = 16  # a batch or sequence range whose max/min reaches this gets two profiles
MAX_PROFILES = 4


def split_range(r: Range) -> list[Range]:
    """(1, 128, 512) -> [(1, 22, 22), (22, 128, 512)]: split at the geometric middle, opt kept where it falls."""
    lo, opt, hi = r
    if hi / max(lo, 1) < WIDE_RATIO:
        return [r]
    mid = max(lo, int(math.sqrt(lo * hi)))
    return [(lo, min(opt, mid), mid), (mid, max(opt, mid), hi)]


def dim_profiles(plan: ShapePlan) -> list[dict[str, Range]]:
    """One dict (dim name -> range) per profile; profile 0 holds the plan's opt sizes where it can."""
    names = list(plan.ranges)
    options = [split_range(plan.ranges[n]) if plan.kinds.get(n) in ("batch", "seq") else [plan.ranges[n]]
               for n in names]
    combos = list(itertools.product(*options))[:MAX_PROFILES]
    opt = plan.at("opt")
    combos.sort(key=lambda c: not all(r[0] <= opt[n] <= r[2] for n, r in zip(names, c)))
    return [dict(zip(names, c)) for c in combos]


def input_shapes(inputs: tuple[TensorSpec, ...], dims: dict[str, Range]) -> dict[str, list[list[int]]]:
    """Input name -> [min shape, opt shape, max shape] for the inputs with dynamic dimensions."""
    shapes = {}
    for spec in inputs:
        if not spec.dynamic_dims:
            continue
        shapes[spec.name] = [[d if isinstance(d, int) else dims[d][i] for d in spec.dims] for i in range(3)]
    return shapes
