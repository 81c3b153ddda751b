"""Graph pass `upgrade-opset`: models at opsets 13-17 with attention -> opset 18, before fusion.

The TorchScript exporter's usual setting is opset 17, but the ONNX body of edgeattn::WindowedAttention
needs 18 (Reduce* axes as inputs). ONNX's version converter rewrites every node whose definition changed
(ReduceMean axes to an input, Split's `split`, Pad, ...); onnxscript's converter starts at 18 and would only
relabel these graphs. A model without attention, already at 18 or newer, or below 13 (Softmax meant
something else before 13) is left alone, the last with the reason.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir

from edgeattn.passes import PassContext, PassResult
from edgeattn.passes.fuse_attention import MIN_OPSET, candidates

OLDEST = 13  # Softmax flattens to 2-D before opset 13: an attention pattern below it is another graph


def upgrade(model: ir.Model, target: int) -> None:
    """Convert `model` to default-domain opset `target` in place with ONNX's version converter."""
    converted = onnx.version_converter.convert_version(ir.serde.serialize_model(model), target)
    new = ir.serde.deserialize_model(converted)
    model.graph = new.graph
    model.functions.clear()
    model.functions.update(new.functions)
    model.ir_version = max(model.ir_version or 0, new.ir_version or 0, 8)  # opset 18 needs IR >= 8


class UpgradeOpset:
    name = "upgrade-opset"

    def __call__(self, model: ir.Model, ctx: PassContext) -> PassResult:
        opset = model.opset_imports.get("", 0)
        details = {"from": opset, "to": opset}
        if opset >= MIN_OPSET:
            return PassResult(self.name, False, f"opset {opset}: no upgrade needed", details)
        if ctx.passes and "fuse-attention" not in ctx.passes:
            return PassResult(self.name, False, f"opset {opset} kept: fuse-attention is not run", details)
        blocks = len(candidates(model.graph))
        if not blocks:
            return PassResult(self.name, False, f"opset {opset} kept: no attention to fuse", details)
        if opset < OLDEST:
            return PassResult(self.name, False, f"opset {opset} kept", details, [
                f"opset {opset} not upgraded: expected {OLDEST} or newer (re-export at opset {MIN_OPSET})"])
        try:
            upgrade(model, MIN_OPSET)
        except Exception as exc:  # the converter raises its own C++ error types
            return PassResult(self.name, False, f"opset {opset} kept", details, [
                f"opset {opset} -> {MIN_OPSET} upgrade failed ({str(exc).splitlines()[0][:200]}); "
                f"re-export at opset {MIN_OPSET}"])
        details["to"] = MIN_OPSET
        return PassResult(self.name, True, f"upgraded from opset {opset} to {MIN_OPSET} (the attention op's "
                          f"ONNX body needs {MIN_OPSET}; {blocks} attention block(s) found)", details)
