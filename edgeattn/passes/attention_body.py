"""Pick the ONNX body of edgeattn::WindowedAttention that suits the target.

The blocked body's cost follows the window (long sequences, any runtime); the dense body has a tenth of
the nodes and wins on a CPU at short sequences. `attention_body` (build option): auto | blocked | dense.
auto: dense for ONNX Runtime targets whose sequence range ends at or below DENSE_MAX_SEQ, else blocked.
For ONNX Runtime the dense body is inlined here and the per-layer copies of the mask computation are merged
(common-subexpression elimination): the processed model then holds plain ops, the window still a graph input.
TensorRT targets replace the node with the plugin, so the body only matters where it runs as ONNX.
"""

from __future__ import annotations

import onnx_ir as ir

from edgeattn.attention import DOMAIN, OP_TYPE
from edgeattn.attention.onnx_function import BODIES, DENSE_MAX_SEQ, function_proto
from edgeattn.passes import PassContext, PassResult


def choose(backend: str, seq_max: int, asked: str = "auto") -> tuple[str, str]:
    """(body, why) for a backend and the largest sequence length the bundle accepts."""
    if asked in BODIES:
        return asked, f"asked for {asked}"
    if backend != "onnxruntime":
        return "blocked", f"{backend} runs the op as a plugin; the portable body stays blocked"
    if seq_max <= DENSE_MAX_SEQ:
        return "dense", f"sequences up to {seq_max} <= {DENSE_MAX_SEQ}: fewest nodes wins on ONNX Runtime"
    return "blocked", f"sequences up to {seq_max} > {DENSE_MAX_SEQ}: work must follow the window"


class AttentionBody:
    name = "attention-body"

    def __call__(self, model: ir.Model, ctx: PassContext) -> PassResult:
        key = (DOMAIN, OP_TYPE, "")
        if key not in model.functions:
            return PassResult(self.name, False, "no WindowedAttention body in the model", {"body": None})
        seq_max = int((ctx.options.get("seq") or (1, 128, DENSE_MAX_SEQ))[2])
        body, why = choose(ctx.target.backend, seq_max, ctx.options.get("attention_body", "auto"))
        opset = model.opset_imports.get("", 18)
        details = {"body": body, "why": why, "inlined": 0}
        if body == "dense":
            model.functions[key] = ir.serde.deserialize_function(function_proto(opset, body))
            if ctx.target.backend == "onnxruntime":
                details["inlined"] = _inline_and_share(model)
                why += f"; inlined into {details['inlined']} layers, one shared mask"
        return PassResult(self.name, body != "blocked", f"{body} attention body ({why})", details)


def _inline_and_share(model: ir.Model) -> int:
    """Inline the op (ONNX Runtime would anyway) and merge the identical per-layer mask computations."""
    import onnx_ir.passes.common as common

    nodes = sum(1 for n in model.graph.all_nodes() if n.domain == DOMAIN and n.op_type == OP_TYPE)
    for p in (common.InlinePass(), common.CommonSubexpressionEliminationPass(), common.RemoveUnusedNodesPass(),
              common.RemoveUnusedFunctionsPass()):
        p(model)
    model.opset_imports.pop(DOMAIN, None)
    return nodes
