"""Graph passes run by `edgeattn build`: small, named, and each reports what it did and did not do.

A pass takes an onnx_ir Model and a PassContext, may change the model in place, and returns a
PassResult. `problems` carries everything the user must hear about: a fusion that did not fire and
why, a layer left in float. Nothing falls back silently. Which passes a target runs, in which order,
is its build plan (`edgeattn.passes.plans`): a pass never checks the target's backend to skip itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import onnx_ir as ir

from edgeattn.errors import ConfigError
from edgeattn.targets import Target


CACHED_ATTENTION_FORMS = ("ops", "fused", "fast_path")


@dataclass(frozen=True)
class PassContext:
    """What the passes of one build may read: the target and the build options that shape the graph."""

    target: Target
    seq: tuple[int, int, int] = (1, 128, 512)  # the sequence range the bundle accepts (attention-body)
    attention_body: str = "auto"  # auto | blocked | dense (attention-body)
    cached_attention: str = "ops"  # ops | fused | fast_path (lower-cached-cpu)
    rotary_rows: int | None = None  # fast_path: positions of the constant rotation tables (lower-cached-cpu)
    strict: bool = False  # fail when a requested fusion did not happen (fuse-attention)
    as_inference: bool = False  # rewrite training-mode nodes instead of refusing (inference-mode)
    passes: tuple[str, ...] = ()  # the names of the passes this build runs (upgrade-opset asks for fuse-attention)

    def __post_init__(self) -> None:
        if self.cached_attention not in CACHED_ATTENTION_FORMS:
            raise ConfigError(f"cached_attention: expected one of {', '.join(CACHED_ATTENTION_FORMS)}, "
                              f"found {self.cached_attention!r}")


@dataclass
class PassResult:
    name: str
    changed: bool
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0  # set by the plan that ran it

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "changed": self.changed, "summary": self.summary,
                "details": self.details, "problems": self.problems, "seconds": round(self.seconds, 3)}


class GraphPass(Protocol):
    name: str

    def __call__(self, model: ir.Model, ctx: PassContext) -> PassResult: ...
