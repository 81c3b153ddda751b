"""Remove what nothing uses: dead nodes, unused functions and opset imports."""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common as common

from edgeattn.passes import PassContext, PassResult


class Cleanup:
    name = "cleanup"

    def __call__(self, model: ir.Model, ctx: PassContext) -> PassResult:
        before = sum(1 for _ in model.graph.all_nodes())
        changed = False
        for p in (common.RemoveUnusedNodesPass(), common.RemoveUnusedFunctionsPass(),
                  common.RemoveUnusedOpsetsPass()):
            changed |= p(model).modified
        after = sum(1 for _ in model.graph.all_nodes())
        return PassResult(self.name, changed, f"{before} -> {after} nodes",
                          {"nodes_before": before, "nodes_after": after})
