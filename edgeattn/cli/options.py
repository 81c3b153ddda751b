"""Click parameter types shared by the commands."""

from __future__ import annotations

import click

from edgeattn.errors import EdgeAttnError
from edgeattn.shapes import parse_range


class RangeType(click.ParamType):
    """N, MIN:OPT or MIN:OPT:MAX."""

    name = "MIN:OPT:MAX"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        try:
            return parse_range(value, f"--{param.name}" if param else "range")
        except EdgeAttnError as exc:
            self.fail(str(exc), param, ctx)


class DimType(click.ParamType):
    """NAME=MIN:OPT:MAX for one named dynamic dimension."""

    name = "DIM=MIN:OPT:MAX"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        name, sep, spec = str(value).partition("=")
        if not sep or not name:
            self.fail(f"expected NAME=MIN:OPT:MAX, found {value!r}", param, ctx)
        try:
            return (name, parse_range(spec, f"--dim {name}"))
        except EdgeAttnError as exc:
            self.fail(str(exc), param, ctx)
