"""Fuse exact (erf) GELU into ONNX Runtime's com.microsoft.Gelu for the cpu target.

    x * (0.5 * (erf(x / sqrt(2)) + 1))   and the orderings  (x * (erf(..) + 1)) * 0.5,  x / sqrt2 as x * (1 / sqrt2)
      -> com.microsoft.Gelu(x)
The constants may be initializers (dynamo) or Constant nodes (TorchScript).

Dynamo exports of BERT-family models spell GELU as the first form, which ONNX Runtime's own GeluFusion does
not match, leaving five element-wise ops per MLP. TensorRT targets are left alone (TensorRT fuses GELU).
"""

from __future__ import annotations

import math

import onnx_ir as ir

from edgeattn.passes import PassContext, PassResult
from edgeattn.passes.rewiring import replace_value

MS = "com.microsoft"


def _scalar(value: ir.Value | None) -> float | None:
    """A one-element constant: an initializer or a Constant node's output (TorchScript's spelling)."""
    tensor = ir.convenience.get_const_tensor(value) if value is not None else None
    if tensor is None:
        return None
    a = tensor.numpy()
    return float(a.reshape(())) if a.size == 1 else None


def _other(node: ir.Node, value: ir.Value) -> ir.Value | None:
    """The other input of a binary node that reads `value`."""
    a, b = node.inputs[:2]
    return b if a is value else a if b is value else None


def _only_use(value: ir.Value, op_type: str) -> ir.Node | None:
    uses = list(value.uses())
    return uses[0].node if len(uses) == 1 and uses[0].node.op_type == op_type else None


def _close(x: float | None, want: float) -> bool:
    return x is not None and abs(x - want) <= 1e-4 * abs(want)


def match(erf: ir.Node) -> tuple[ir.Value, ir.Node] | str:
    """(x, the node whose output is GELU(x)) or why this Erf is not an exact GELU."""
    scale = erf.inputs[0].producer()
    if scale is None or scale.op_type not in ("Div", "Mul"):
        return "Erf input is not x / sqrt(2)"
    x = scale.inputs[0]
    c = _scalar(scale.inputs[1])
    if not (_close(c, math.sqrt(2)) if scale.op_type == "Div" else _close(c, 1 / math.sqrt(2))):
        return f"Erf input is x {scale.op_type} {'a non-constant' if c is None else c}, not x / sqrt(2)"
    add = _only_use(erf.outputs[0], "Add")
    if add is None or not _close(_scalar(_other(add, erf.outputs[0])), 1.0):
        return "Erf output is not followed by + 1"
    first = _only_use(add.outputs[0], "Mul")
    if first is None:
        return "(erf + 1) is not multiplied"
    f_other = _other(first, add.outputs[0])
    if _close(_scalar(f_other), 0.5):  # 0.5 * (erf + 1), then * x
        last = _only_use(first.outputs[0], "Mul")
        ok = last is not None and _other(last, first.outputs[0]) is x
    elif f_other is x:  # x * (erf + 1), then * 0.5
        last = _only_use(first.outputs[0], "Mul")
        ok = last is not None and _close(_scalar(_other(last, first.outputs[0])), 0.5)
    else:
        return "(erf + 1) is multiplied by neither 0.5 nor x"
    return (x, last) if ok else "the product is not x * 0.5 * (erf + 1)"


class FuseGeluForCpu:
    name = "fuse-gelu-cpu"

    def __call__(self, model: ir.Model, ctx: PassContext) -> PassResult:
        graph = model.graph
        fused, problems = 0, []
        for erf in [n for n in graph if n.op_type == "Erf" and n.domain in ("", "ai.onnx")]:
            found = match(erf)
            if isinstance(found, str):
                problems.append(f"{erf.name or 'Erf'}: left as separate ops: {found}")
                continue
            x, last = found
            gelu = ir.node("Gelu", [x], domain=MS, name=f"{last.name or 'gelu'}/gelu")
            if last.outputs[0].dtype is not None:  # an untyped value stays untyped (Tensor(None) cannot be saved)
                gelu.outputs[0].dtype, gelu.outputs[0].shape = last.outputs[0].dtype, last.outputs[0].shape
            graph.insert_before(last, [gelu])
            replace_value(graph, last.outputs[0], gelu.outputs[0])
            fused += 1
        if fused:
            model.opset_imports.setdefault(MS, 1)
            import onnx_ir.passes.common as common

            common.RemoveUnusedNodesPass()(model)
        native = sum(1 for n in graph if n.op_type == "Gelu" and n.domain in ("", "ai.onnx"))  # opset 20's op
        summary = f"{fused} GELU(s) -> com.microsoft.Gelu" + (f", {native} already the Gelu op" if native else "")
        return PassResult(self.name, fused > 0, summary,
                          {"fused": fused, "native": native, "unfused": len(problems)}, problems)


__all__ = ["FuseGeluForCpu", "match"]
