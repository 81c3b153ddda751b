"""Graph pass `inference-mode`: refuse a model exported in training mode, or build it as inference.

A module left in `train()` mode when exported keeps its training behaviour in the graph: the dynamo
exporter writes Dropout with `training_mode` = true (random outputs: parity fails, TensorRT's parser
asserts), and BatchNormalization with `training_mode` = 1 (batch statistics instead of running ones).
Without the build option `as_inference` this pass raises an InputError that names the nodes and says
how to fix the export; with it, training Dropouts become the identity and BatchNormalization uses its
running statistics, and the pass reports each node it changed.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import onnx_ir as ir

from edgeattn.errors import InputError
from edgeattn.passes import PassContext, PassResult
from edgeattn.passes.rewiring import replace_value

SHOWN = 5  # node names quoted in the error


def _is(node: ir.Node, op_type: str) -> bool:
    return node.op_type == op_type and node.domain in ("", "ai.onnx")


def _dropout_training(node: ir.Node) -> str | None:
    """Why this Dropout trains ('training_mode is true' / '... is a graph input'), None if it does not."""
    mode = node.inputs[2] if len(node.inputs) > 2 else None
    if mode is None:
        return None  # the default: inference
    tensor = ir.convenience.get_const_tensor(mode)
    if tensor is None:
        return f"training_mode is computed at run time ({mode.name})"
    return "training_mode is true" if bool(tensor.numpy().reshape(-1)[0]) else None


def training_nodes(graph: ir.Graph) -> list[tuple[ir.Node, str]]:
    """Every node that computes differently in training mode, with why."""
    found = []
    for node in graph.all_nodes():
        if _is(node, "Dropout") and (why := _dropout_training(node)):
            found.append((node, why))
        elif _is(node, "BatchNormalization") and node.attributes.get_int("training_mode", 0):
            found.append((node, "training_mode=1 (batch statistics)"))
    return found


def _to_inference(graph: ir.Graph, node: ir.Node) -> str | None:
    """Rewrite one training node for inference in place; why not, if it cannot be."""
    if any(o.uses() or o in graph.outputs for o in node.outputs[1:]):
        return f"{_label(node)}: its mask or batch-statistics outputs are read by the graph"
    if _is(node, "Dropout"):
        replace_value(node.graph or graph, node.outputs[0], node.inputs[0])
        (node.graph or graph).remove(node, safe=True)
    else:
        node.attributes["training_mode"] = ir.AttrInt64("training_mode", 0)
    return None


def inference_reference(source: onnx.ModelProto, folder: Path, stem: str) -> Path:
    """The source with its training-mode nodes rewritten, saved in `folder`: what an --as-inference
    build is checked against (the training-mode source itself is random)."""
    model = ir.serde.deserialize_model(source)
    for node, _ in training_nodes(model.graph):
        _to_inference(model.graph, node)
    path = Path(folder) / f"{stem}-as-inference.onnx"
    onnx.save(ir.serde.serialize_model(model), str(path))
    return path


def _label(node: ir.Node) -> str:
    return node.name or f"{node.op_type} -> {node.outputs[0].name}"


class InferenceMode:
    name = "inference-mode"

    def __call__(self, model: ir.Model, ctx: PassContext) -> PassResult:
        found = training_nodes(model.graph)
        if not found:
            return PassResult(self.name, False, "no training-mode nodes", {"training_nodes": []})
        names = [f"{_label(n)} ({why})" for n, why in found]
        if not ctx.as_inference:
            shown = "; ".join(names[:SHOWN]) + (f"; and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
            raise InputError(
                f"expected a model exported for inference, found {len(found)} training-mode node(s): {shown}. "
                "The module was exported in train() mode: call model.eval() before torch.onnx.export, "
                "or build it as inference with --as-inference (Dropout removed, BatchNormalization on "
                "running statistics)")
        blocked = [why for n, _ in found if (why := _to_inference(model.graph, n))]
        if blocked:
            raise InputError(f"--as-inference: expected training nodes whose extra outputs are unused, found "
                             f"{'; '.join(blocked)}; re-export the model with model.eval()")
        ops = sorted({n.op_type for n, _ in found})
        return PassResult(self.name, True, f"built as inference: {len(found)} training-mode node(s) "
                          f"({', '.join(ops)}) rewritten (--as-inference)", {"training_nodes": names})
