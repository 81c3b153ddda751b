"""Build plans: the graph passes each backend runs, in order, on onnx-ir's pass infrastructure.

A plan is data: a name and the names of its passes (`edgeattn.passes.registry`). The order rules between
passes are data too (ORDER), checked when a plan is made, so a plan that breaks one cannot exist. A target
runs its backend's plan (`plan_for`); a pass that does not apply to a backend is not in that backend's plan,
rather than a pass that checks the backend and returns. `run` wraps each pass in an onnx-ir `InPlacePass` and
runs them with `onnx_ir.passes.PassManager`, which names the pass that failed and the passes before it.

| plan | backend | passes |
|---|---|---|
| cpu | onnxruntime | all of them: fusion, the op's body, the cpu lowerings, the 2:4 check |
| fast path | onnxruntime (decoders) | cpu's, with the cached attention as GroupQueryAttention over the cache |
| tensorrt | tensorrt, tensorrt_rtx | fusion, the op's body, cleanup, the 2:4 check: the builder lowers the rest |
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

import onnx_ir as ir

from edgeattn.errors import BuildError, ConfigError, InputError, StrictModeError
from edgeattn.passes import PassContext, PassResult
from edgeattn.passes.registry import PASSES, load_pass

# (earlier, later, why): where both are in a plan, `earlier` runs first
ORDER: tuple[tuple[str, str, str], ...] = (
    ("inference-mode", "fuse-attention", "training-mode nodes are refused or removed before anything matches"),
    ("upgrade-opset", "fuse-attention", "the op's ONNX body needs opset 18"),
    ("fuse-attention", "attention-body", "the body is chosen for the fused nodes"),
    ("fuse-rotary-cpu", "lower-cached-cpu", "the cached attention's GroupQueryAttention form reads the rotary tables"),
    ("lower-cached-cpu", "logits-to-keep", "the LM head is sliced after the attention is lowered"),
    ("check-sparsity", "lower-qdq-cpu", "the 2:4 check reads the MatMuls lower-qdq-cpu rewrites"),
)


@dataclass(frozen=True)
class BuildPlan:
    """A named, ordered list of graph passes. Validated on construction: known passes, ORDER kept."""

    name: str
    passes: tuple[str, ...]

    def __post_init__(self) -> None:
        unknown = [p for p in self.passes if p not in PASSES]
        if unknown:
            raise ConfigError(f"plan {self.name}: unknown graph pass(es) {unknown}: expected names from "
                              f"{', '.join(PASSES)}")
        for earlier, later, why in ORDER:
            if earlier in self.passes and later in self.passes and \
                    self.passes.index(earlier) > self.passes.index(later):
                raise ConfigError(f"plan {self.name}: expected {earlier} before {later} ({why}), found it after")

    def with_pass(self, name: str, *, after: str) -> "BuildPlan":
        """This plan with pass `name` inserted after the pass `after`."""
        if after not in self.passes:
            raise ConfigError(f"plan {self.name}: expected `after` among {', '.join(self.passes)}, found {after!r}")
        i = self.passes.index(after) + 1
        return dataclasses.replace(self, passes=self.passes[:i] + (name,) + self.passes[i:])

    def only(self, names: tuple[str, ...]) -> "BuildPlan":
        """The passes of this plan that are in `names`, in the plan's order (`BuildConfig.passes`)."""
        foreign = [n for n in names if n not in self.passes]
        if foreign:
            raise ConfigError(f"passes {foreign}: expected passes of the {self.name} plan "
                              f"({', '.join(self.passes)})")
        return dataclasses.replace(self, passes=tuple(p for p in self.passes if p in names))

    def run(self, model: ir.Model, ctx: PassContext, progress: Callable[[str], None] = lambda msg: None
            ) -> list[PassResult]:
        """Run every pass on `model` in place; each one's result, with its time, in order.

        A pass that raises an InputError (or --strict's error) stops the build with that error; any other
        failure becomes a BuildError naming the pass and the passes before it."""
        ctx = dataclasses.replace(ctx, passes=self.passes)
        results: list[PassResult] = []

        def done(result: PassResult) -> None:
            results.append(result)
            progress(f"pass {result.name}: {'changed' if result.changed else 'unchanged'} in "
                     f"{result.seconds:.2f} s ({result.summary})")

        if not self.passes:
            return results
        try:
            ir.passes.PassManager([_Step(load_pass(n), ctx, done) for n in self.passes], steps=1)(model)
        except ir.passes.PassError as exc:
            cause = _root(exc)
            if isinstance(cause, (InputError, StrictModeError)):
                raise cause from None  # the user's to fix, already said in full
            failed = self.passes[len(results)]
            before = ", ".join(r.name for r in results) or "none"
            raise BuildError(f"graph pass {failed!r} of the {self.name} plan failed ({cause}); passes before "
                             f"it: {before}") from cause
        return results


class _Step(ir.passes.InPlacePass):
    """One graph pass on onnx-ir's infrastructure: runs it with the build's context and hands on its result."""

    def __init__(self, graph_pass, ctx: PassContext, done: Callable[[PassResult], None]) -> None:
        self.graph_pass, self.ctx, self.done = graph_pass, ctx, done

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        start = time.perf_counter()
        result = self.graph_pass(model, self.ctx)
        result.seconds = time.perf_counter() - start
        self.done(result)
        return ir.passes.PassResult(model, result.changed)

    def __str__(self) -> str:
        return self.graph_pass.name


def _root(exc: BaseException) -> BaseException:
    """The error a pass raised, under the PassErrors the pass manager wraps it in."""
    while isinstance(exc, (ir.passes.PassError, ir.passes.InvariantError)) and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


CPU = BuildPlan("cpu", ("inference-mode", "upgrade-opset", "fuse-attention", "attention-body", "fuse-rmsnorm-cpu",
                        "fuse-rotary-cpu", "lower-cached-cpu", "logits-to-keep", "pack-matmuls-cpu", "cleanup",
                        "check-sparsity", "lower-qdq-cpu", "fuse-gelu-cpu"))


def fast_path_of(plan: BuildPlan) -> BuildPlan:
    """A cpu decoder's second plan: the cpu plan's passes, run with PassContext(cached_attention="fast_path")."""
    return dataclasses.replace(plan, name="fast path")


FAST_PATH = fast_path_of(CPU)
TENSORRT = BuildPlan("tensorrt", ("inference-mode", "upgrade-opset", "fuse-attention", "attention-body", "cleanup",
                                  "check-sparsity"))

PLANS: dict[str, BuildPlan] = {"onnxruntime": CPU, "tensorrt": TENSORRT, "tensorrt_rtx": TENSORRT}


def plan_for(backend: str) -> BuildPlan:
    try:
        return PLANS[backend]
    except KeyError:
        raise ConfigError(f"no build plan for backend {backend!r}: expected one of {', '.join(PLANS)}") from None
