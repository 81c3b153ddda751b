"""Graph passes run by `edgeattn build`: small, named, and each reports what it did and did not do.

A pass takes an onnx_ir Model and a PassContext, may change the model in place, and returns a
PassResult. `problems` carries everything the user must hear about: a fusion that did not fire and
why, a layer left in float. Nothing falls back silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import onnx_ir as ir

from edgeattn.targets import Target


@dataclass(frozen=True)
class PassContext:
    target: Target
    options: dict[str, Any] = field(default_factory=dict)  # the build config, as a dict


@dataclass
class PassResult:
    name: str
    changed: bool
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "changed": self.changed, "summary": self.summary,
                "details": self.details, "problems": self.problems}


class GraphPass(Protocol):
    name: str

    def __call__(self, model: ir.Model, ctx: PassContext) -> PassResult: ...
