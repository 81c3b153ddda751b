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


def _config_names() -> list[str]:
    from edgeattn.quantize.config import config_names
    return config_names()


class QuantConfigChoice(click.Choice):
    """One of the quantization configs registered when the command runs (not when it was imported), so a
    config registered by a plugin after the CLI loaded is accepted and listed."""

    def __init__(self) -> None:
        super().__init__((), case_sensitive=True)

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(_config_names())

    @choices.setter
    def choices(self, _value) -> None:  # click.Choice.__init__ assigns; the registry is the source
        pass


class QuantConfigOption(click.Option):
    """--config of `edgeattn quantize`: its help lists the configs registered when the help is shown."""

    def get_help_record(self, ctx):
        self.help = (f"A registered quantization config: {', '.join(_config_names())} "
                     "(edgeattn/quantize/configs/ adds more).")
        return super().get_help_record(ctx)
