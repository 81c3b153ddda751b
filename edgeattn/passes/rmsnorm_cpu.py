"""Fuse RMSNorm into ONNX Runtime's SimplifiedLayerNormalization for the cpu target.

    w * (x * 1 / sqrt(mean(x^2, -1) + eps))      (Pow, ReduceMean, Add, Sqrt, Reciprocal | Div, Mul, Mul)
      -> SimplifiedLayerNormalization(x, w, axis=-1, epsilon=eps)

The dynamo exporter writes Llama-family RMSNorm with Reciprocal, a form ONNX Runtime's own
SimplifiedLayerNormFusion does not match (it wants Div), so every norm stays seven element-wise nodes: 427
nodes a decode step in SmolLM2. Once fused, ONNX Runtime's SkipLayerNormFusion folds the residual Add in
front of each norm too. TensorRT targets are left alone.
"""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common as common

from edgeattn.passes import PassContext, PassResult
from edgeattn.passes.gelu_cpu import _close, _only_use, _other, _scalar
from edgeattn.passes.rewiring import anchored, replace_value

MS = "com.microsoft"


def _axes_last(node: ir.Node) -> bool:
    axes = node.attributes.get_ints("axes", None)
    if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
        tensor = ir.convenience.get_const_tensor(node.inputs[1])
        axes = None if tensor is None else [int(a) for a in tensor.numpy().reshape(-1)]
    rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else None
    return axes is not None and len(axes) == 1 and (axes[0] == -1 or (rank is not None and axes[0] == rank - 1))


def match(mean: ir.Node) -> tuple[ir.Value, ir.Value, float, ir.Node, ir.Node] | str:
    """(x, weight, epsilon, the node that scales x by 1 / sqrt(..), the node whose output is the norm) or why
    this ReduceMean is not an RMSNorm."""
    pow_ = mean.inputs[0].producer()
    if pow_ is None or pow_.op_type != "Pow" or not _close(_scalar(pow_.inputs[1]), 2.0):
        return "ReduceMean input is not x ^ 2"
    x = pow_.inputs[0]
    centre = x.producer()
    if centre is not None and centre.op_type == "Sub" and (mean_of := centre.inputs[1].producer()) is not None \
            and mean_of.op_type == "ReduceMean" and mean_of.inputs[0] is centre.inputs[0]:
        return "ReduceMean input is not x ^ 2 but (x - mean(x)) ^ 2: a LayerNorm (ONNX Runtime fuses those)"
    if x.dtype != ir.DataType.FLOAT:
        return f"x is {x.dtype}, the fusion handles float32"
    if not _axes_last(mean) or mean.attributes.get_int("keepdims", 1) != 1:
        return "ReduceMean is not over the last axis with keepdims"
    add = _only_use(mean.outputs[0], "Add")
    eps = _scalar(_other(add, mean.outputs[0])) if add is not None else None
    if eps is None:
        return "mean(x^2) is not followed by + a constant epsilon"
    sqrt = _only_use(add.outputs[0], "Sqrt")
    if sqrt is None:
        return "mean + eps is not followed by Sqrt"
    inv = _only_use(sqrt.outputs[0], "Reciprocal")
    if inv is None:  # 1 / sqrt(..) as a Div (the TorchScript exporter's spelling)
        div = _only_use(sqrt.outputs[0], "Div")
        inv = div if div is not None and div.inputs[1] is sqrt.outputs[0] and _close(_scalar(div.inputs[0]), 1.0) \
            else None
    if inv is not None:
        scale = _only_use(inv.outputs[0], "Mul")
        if scale is None or _other(scale, inv.outputs[0]) is not x:
            return "1 / sqrt(..) does not scale x"
    else:
        scale = _only_use(sqrt.outputs[0], "Div")
        if scale is None or scale.inputs[0] is not x:
            return "sqrt(..) does not divide x"
    normed = scale.outputs[0]
    cast = _only_use(normed, "Cast")  # `.to(input_dtype)` before the weight (TorchScript), a no-op in float32
    if cast is not None and cast.attributes.get_int("to", 0) == ir.DataType.FLOAT:
        normed = cast.outputs[0]
    weigh = _only_use(normed, "Mul")
    weight = _other(weigh, normed) if weigh is not None else None
    while weight is not None and weight.producer() is not None and weight.producer().op_type == "Identity":
        weight = weight.producer().inputs[0]  # the TorchScript exporter shares equal weights through Identity
    tensor = ir.convenience.get_const_tensor(weight) if weight is not None else None
    if tensor is None or len(tensor.shape) != 1:
        return "the normalized x is not multiplied by a constant 1-D weight"
    return x, weight, eps, scale, weigh


class FuseRmsNormForCpu:
    name = "fuse-rmsnorm-cpu"

    def __call__(self, model: ir.Model, ctx: PassContext) -> PassResult:
        fused, skipped, unfused = 0, 0, []
        graph = model.graph
        for _, found in anchored(graph, "ReduceMean", match, unfused, ignore="ReduceMean input is not"):
            x, weight, eps, scale, weigh = found
            if _residual(x) is not None:
                _skip_norm(graph, _residual(x), weight, eps, weigh)
                skipped += 1
            elif scale.op_type == "Mul":  # x * (1 / sqrt(..)) -> x / sqrt(..), the spelling ONNX Runtime fuses
                inv = _other(scale, x).producer()  # Reciprocal(sqrt) or Div(1, sqrt)
                div = ir.node("Div", [x, inv.inputs[-1]], name=f"{scale.name}/Div")
                graph.insert_before(scale, div)
                div.outputs[0].shape, div.outputs[0].dtype = scale.outputs[0].shape, scale.outputs[0].dtype
                replace_value(graph, scale.outputs[0], div.outputs[0])
            fused += 1
        if skipped:
            model.opset_imports.setdefault(MS, 1)
        if fused:
            common.RemoveUnusedNodesPass()(model)
        problems = [f"RMSNorm at {u['node']} left as element-wise ops: {u['reason']}" for u in unfused]
        return PassResult(self.name, fused > 0, f"{fused} RMSNorm for ONNX Runtime: {skipped} with their residual Add "
                          f"fused into SkipSimplifiedLayerNormalization, {fused - skipped} spelled for its "
                          "SimplifiedLayerNormalization fusion", {"fused": fused, "with_residual": skipped,
                                                                   "unfused": unfused}, problems)


def _residual(x: ir.Value) -> ir.Node | None:
    """The Add that makes x, when it sums two float [B, S, hidden] tensors of one shape (a residual)."""
    add = x.producer()
    if add is None or add.op_type != "Add" or add.domain != "":
        return None
    a, b = add.inputs[:2]
    if any(v.shape is None or len(v.shape) != 3 or v.dtype != ir.DataType.FLOAT for v in (a, b)):
        return None
    same = all(str(p) == str(q) for p, q in zip(a.shape, b.shape)) and isinstance(a.shape[2], int)
    return add if same else None


def _skip_norm(graph: ir.Graph, add: ir.Node, weight: ir.Value, eps: float, weigh: ir.Node) -> None:
    """norm(a + b) and a + b from one com.microsoft.SkipSimplifiedLayerNormalization (its output 3 is the sum)."""
    node = ir.node("SkipSimplifiedLayerNormalization", [add.inputs[0], add.inputs[1], weight],
                   attributes={"epsilon": eps}, domain=MS, num_outputs=4, name=f"{weigh.name}/SkipSimplifiedLayerNorm")
    graph.insert_before(weigh, node)
    y, total = node.outputs[0], node.outputs[3]
    y.shape, y.dtype = weigh.outputs[0].shape, weigh.outputs[0].dtype
    total.shape, total.dtype = add.outputs[0].shape, add.outputs[0].dtype
    replace_value(graph, weigh.outputs[0], y)
    later = [u for u in add.outputs[0].uses() if _after(graph, u.node, node)]
    for use in later:  # readers of the sum after the norm (the next residual) read output 3
        use.node.replace_input_with(use.idx, total)


def _after(graph: ir.Graph, node: ir.Node, anchor: ir.Node) -> bool:
    order = {id(n): i for i, n in enumerate(graph)}
    return order[id(node)] > order[id(anchor)]
