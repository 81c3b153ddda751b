"""Graph pass `fuse-attention`: attention blocks of imported ONNX models -> edgeattn::WindowedAttention.

Finds softmax(Q K^T) V blocks (torch dynamo and TorchScript exporters, eager attention) and the opset-23
Attention op, replaces each with the windowed op reading a new int64 scalar graph input
`attention_window` (0 = full attention), and attaches the op's ONNX function. Every softmax(QK^T)V
pattern left unfused is reported with the reason.
"""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common as common
from onnxscript.rewriter import pattern

from edgeattn.attention import DOMAIN, OP_TYPE, OPSET_VERSION
from edgeattn.errors import ModelError, StrictModeError
from edgeattn.passes import PassContext, PassResult
from edgeattn.passes import fuse_attention_contrib as contrib
from edgeattn.passes import fuse_attention_masks as masks_mod
from edgeattn.passes.fuse_attention_rules import SoftmaxAttention, StandardAttention

WINDOW_INPUT = "attention_window"
MIN_OPSET = 18  # the op's ONNX body (attention/onnx_function.py) reads Reduce* axes as inputs


def _is(node: ir.Node, op_type: str) -> bool:
    return node.op_type == op_type and node.domain in ("", "ai.onnx")


def _mask_candidates(graph: ir.Graph) -> tuple[dict[str, str], list[tuple[str, bool]]]:
    """Values that may be masks: softmax operands (name -> 'add' | 'keep') and Attention masks."""
    softmax_masks, attention_masks = {}, []
    for node in graph:
        if _is(node, "Softmax") and (src := node.inputs[0].producer()) is not None:
            if _is(src, "Add"):
                softmax_masks.update({v.name: "add" for v in src.inputs})
            elif _is(src, "Where"):
                softmax_masks[src.inputs[0].name] = "keep"
        elif _is(node, "Attention") and len(node.inputs) > 3 and node.inputs[3] is not None:
            attention_masks.append((node.inputs[3].name, bool(node.attributes.get_int("is_causal", 0))))
    return softmax_masks, attention_masks


def _mask_meanings(model: ir.Model) -> tuple[dict, str | None]:
    softmax_masks, attention_masks = _mask_candidates(model.graph)
    index_masks = contrib.mask_inputs(model.graph)
    names = sorted(set(softmax_masks) | {n for n, _ in attention_masks} | {n for n, _ in index_masks})
    if not names:
        return {}, None
    values, pad = masks_mod.probe(ir.serde.serialize_model(model), names)
    meanings: dict = {}
    for name, kind in softmax_masks.items():
        meanings[name] = masks_mod.meaning(masks_mod.allowed_from(values[name], kind) if not isinstance(values[name], str)
                                           else values[name], pad)
    for name, is_causal in attention_masks:
        value = values[name]
        kind = "keep" if not isinstance(value, str) and value.dtype == bool else "add"
        allowed = masks_mod.allowed_from(value, kind) if not isinstance(value, str) else value
        meanings[(name, is_causal)] = masks_mod.meaning(allowed, pad, is_causal=is_causal)
    for name, is_causal in index_masks:  # com.microsoft mask_index / key_padding_mask
        value = values[name]
        allowed = contrib.allowed_from_index(value) if not isinstance(value, str) else value
        meanings[("index", name, is_causal)] = masks_mod.meaning(allowed, pad, is_causal=is_causal)
    return meanings, pad


def _window_input(graph: ir.Graph) -> ir.Value:
    for value in graph.inputs:
        if value.name == WINDOW_INPUT:
            if value.dtype != ir.DataType.INT64:
                raise ModelError(f"input {WINDOW_INPUT!r}: expected an int64 scalar, found {value.dtype}")
            return value
    value = ir.Value(name=WINDOW_INPUT, type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([]))
    graph.inputs.append(value)
    return value


def _leftovers(graph: ir.Graph, failures: dict[str, str]) -> list[dict[str, str]]:
    """Each softmax(QK^T)V or Attention node still in the graph, with why it was not fused."""
    left = []
    for node in graph:
        if _is(node, "Attention"):
            left.append({"node": _label(node), "reason": failures.get(node.outputs[0].name, "Attention form not recognised")})
        if contrib.is_contrib_attention(node):
            reason = failures.get(node.outputs[0].name) or contrib.unsupported(node)
            left.append({"node": _label(node), "reason": reason or f"com.microsoft {node.op_type} form not recognised"})
        if not _is(node, "Softmax"):
            continue
        matmul = _first_matmul_after(node)
        if matmul is None:
            continue  # a softmax that is not attention (a classifier head, a router)
        src = node.inputs[0].producer()
        reason = failures.get(matmul.outputs[0].name) or (
            f"softmax input comes from {src.op_type if src else 'a graph input'}: expected "
            "MatMul(Q, K^T), optionally scaled (Mul/Div by a constant) and masked (Add or Where)")
        left.append({"node": _label(matmul), "reason": reason})
    return left


def candidates(graph: ir.Graph) -> list[ir.Node]:
    """The graph's attention blocks, unfused: Attention nodes and the MatMuls of softmax(.) V."""
    return [n if _is(n, "Attention") or contrib.is_contrib_attention(n) else _first_matmul_after(n) for n in graph
            if _is(n, "Attention") or contrib.is_contrib_attention(n) or (_is(n, "Softmax") and _first_matmul_after(n))]


def _label(node: ir.Node) -> str:
    return node.name or f"{node.op_type} -> {node.outputs[0].name}"


def _first_matmul_after(node: ir.Node, hops: int = 3) -> ir.Node | None:
    """The MatMul reading a softmax, through Casts and a NaN guard Where(IsNaN(w), 0, w)."""
    for use in node.outputs[0].uses():
        if _is(use.node, "MatMul"):
            return use.node
        passes = _is(use.node, "Cast") or (_is(use.node, "Where") and use.idx == 2)
        if hops and passes and (found := _first_matmul_after(use.node, hops - 1)):
            return found
    return None


def _attach_function(model: ir.Model) -> None:
    from edgeattn.attention.onnx_function import function_proto

    opset = model.opset_imports.get("", 18)
    function = ir.serde.deserialize_function(function_proto(opset))
    model.functions[function.identifier()] = function
    model.opset_imports[DOMAIN] = OPSET_VERSION
    model.ir_version = max(model.ir_version or 0, 10 if opset >= 21 else 9)


def _count(graph: ir.Graph) -> int:
    return sum(1 for n in graph.all_nodes() if n.domain == DOMAIN and n.op_type == OP_TYPE)


class FuseAttention:
    name = "fuse-attention"

    def __call__(self, model: ir.Model, ctx: PassContext) -> PassResult:
        graph = model.graph
        already = _count(graph)
        opset = model.opset_imports.get("", 0)
        if opset < MIN_OPSET:
            reason = f"the op's ONNX body needs opset >= {MIN_OPSET}, the model has opset {opset}"
            left = [{"node": _label(n), "reason": reason} for n in candidates(graph)]
            problems = [f"{len(left)} attention block(s) left unfused: {reason} (the upgrade-opset pass "
                        f"upgrades opsets 13-17)"] if left else []
            return self._strict(ctx, self._result(model, already, left, problems))
        common.ShapeInferencePass()(model)
        while contrib.annotate_shapes(graph):  # ranks through com.microsoft ops, then onward
            common.ShapeInferencePass()(model)
        meanings, pad = _mask_meanings(model)
        window = _window_input(graph)
        padding = next((v for v in graph.inputs if v.name == pad), None)
        failures: dict[str, str] = {}
        rules = [SoftmaxAttention("softmax-attention", window, padding, meanings, failures),
                 StandardAttention("attention-op-masked", window, padding, meanings, failures, with_mask=True),
                 StandardAttention("attention-op", window, padding, meanings, failures, with_mask=False),
                 *contrib.rules(window, padding, meanings, failures)]
        rule_set = pattern.RewriteRuleSet(
            [pattern.RewriteRule(r.pattern, r.rewrite, r.check, name=r.name) for r in rules], commute=True)
        rule_set.apply_to_model(model)
        fused = _count(graph) - already
        left = _leftovers(graph, failures)
        if fused or (already and (DOMAIN, OP_TYPE, "") not in model.functions):
            _attach_function(model)  # a model that already carries its own body for the op keeps it
        elif not window.uses():
            graph.inputs.remove(window)
        common.RemoveUnusedNodesPass()(model)
        problems = [f"attention block at {x['node']} left unfused: {x['reason']}" for x in left]
        return self._strict(ctx, self._result(model, already, left, problems, fused))

    @staticmethod
    def _strict(ctx: PassContext, result: PassResult) -> PassResult:
        """--strict: attention left unfused fails the build here, before any engine is built."""
        left = result.details["unfused"]
        if ctx.strict and left:
            total = len(left) + result.details["windowed_total"]
            raise StrictModeError(f"--strict: expected every attention block fused, found {len(left)} of {total} "
                                  f"left unfused; first: {left[0]['node']}: {left[0]['reason']}")
        return result

    def _result(self, model, already, left, problems, fused: int = 0) -> PassResult:
        details = {"fused": fused, "already_windowed": already, "windowed_total": fused + already,
                   "unfused": left, "window_input": WINDOW_INPUT if fused + already else None}
        summary = f"{fused} attention block(s) fused" + (f", {already} already windowed" if already else "") + \
                  (f", {len(left)} left unfused" if left else "")
        return PassResult(self.name, fused > 0, summary, details, problems)
