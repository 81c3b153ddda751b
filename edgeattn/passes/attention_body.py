"""Pick the ONNX body of edgeattn::WindowedAttention that suits the target.

The blocked body's cost follows the window (long sequences, any runtime); the dense body has a tenth of
the nodes and wins on a CPU at short sequences. `attention_body` (build option): auto | blocked | dense.
auto: dense for ONNX Runtime targets whose sequence range ends at or below DENSE_MAX_SEQ, else blocked.
For ONNX Runtime each node is lowered here to plain ops with its attributes as constants and one mask
shared by all layers (nodes the lowering cannot take keep the dense function, inlined, with the per-layer
mask copies merged); the processed model then holds plain ops, the window still a graph input.
TensorRT targets replace the node with the plugin, so the body only matters where it runs as ONNX.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common

from edgeattn.attention import DOMAIN, OP_TYPE
from edgeattn.attention.onnx_function import BODIES, DENSE_MAX_SEQ, function_proto
from edgeattn.passes import PassContext, PassResult
from edgeattn.passes import attention_ort_fused as fused_attention
from edgeattn.passes.rewiring import constant, replace_value


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
        body, why = choose(ctx.target.backend, int(ctx.seq[2]), ctx.attention_body)
        opset = model.opset_imports.get("", 18)
        details = {"body": body, "why": why, "lowered": 0, "inlined": 0}
        if body == "dense":
            model.functions[key] = ir.serde.deserialize_function(function_proto(opset, body))
            if ctx.target.backend == "onnxruntime":
                lowered, reasons, plain = lower_dense(model)
                details["lowered"], details["kept"], details["plain_ops"] = lowered, reasons, plain
                details["fused_kernels"] = lowered - len(plain)
                if reasons:  # nodes the direct lowering cannot take run the dense function, inlined
                    details["inlined"] = _inline_and_share(model)
                why += f"; {lowered} layers lowered with one shared mask, {lowered - len(plain)} of them to " \
                       f"ONNX Runtime's fused attention kernel" + \
                       (f" ({len(plain)} to plain ops: {'; '.join(sorted(set(plain.values())))})" if plain else "") + \
                       (f", {details['inlined']} inlined ({'; '.join(sorted(set(reasons.values())))})" if reasons else "")
                if not reasons:
                    common.RemoveUnusedFunctionsPass()(model)
                    model.opset_imports.pop(DOMAIN, None)
        return PassResult(self.name, body != "blocked", f"{body} attention body ({why})", details)


def _why_not_lowered(node: ir.Node) -> str | None:
    q, k = node.inputs[0], node.inputs[1]
    if q.dtype != ir.DataType.FLOAT:
        return f"q is {q.dtype}, the direct lowering handles float32"
    if q.shape is None or k.shape is None or len(q.shape) != 4 or len(k.shape) != 4:
        return "q / k shapes unknown"
    h, hkv, d = q.shape[1], k.shape[1], q.shape[3]
    if not all(isinstance(x, int) for x in (h, hkv, d)) or h % hkv:
        return "head counts or head dim not static"
    return None


def lower_dense(model: ir.Model) -> tuple[int, dict[str, str], dict[str, str]]:
    """Replace each WindowedAttention node by ONNX Runtime's fused attention kernel where its inputs are head
    splits of projections (passes/attention_ort_fused.py), else by plain ops (scores, shared additive mask,
    Softmax, weighted sum) with its attributes as constants, so ONNX Runtime fuses the scale into its MatMul.
    The mask ([B, 1, S_k, S_k] bias and "row has a key") is built once per (window, padding, causal, sinks).
    Returns (nodes lowered, {node: why it was kept}, {node lowered to plain ops: why not to the kernel})."""
    common.ShapeInferencePass()(model)
    graph = model.graph
    shared: dict[tuple, tuple[ir.Value, ir.Value]] = {}
    lowered, kept, plain = 0, {}, {}
    for node in [n for n in graph if n.domain == DOMAIN and n.op_type == OP_TYPE]:
        reason = _why_not_lowered(node)
        if reason:
            kept[node.name or "WindowedAttention"] = reason
            continue
        q, k, v, window = node.inputs[:4]
        pad = node.inputs[4] if len(node.inputs) > 4 else None
        causal, sinks = node.attributes.get_int("causal", 1), node.attributes.get_int("sinks", 0)
        h, hkv, d = q.shape[1], k.shape[1], q.shape[3]
        scale = node.attributes.get_float("scale", 0.0) or 1.0 / float(np.sqrt(d))
        new: list[ir.Node] = []

        def op(op_type, *inputs, **attrs):
            n = ir.node(op_type, list(inputs), attributes=attrs, name=f"{node.name}/{op_type}{len(new)}")
            new.append(n)
            return n.outputs[0]

        c = lambda name, value: constant(graph, f"edgeattn_dense_{name}", value)  # noqa: E731
        key = (id(window), id(pad) if pad is not None else id(k), causal, sinks)
        if key not in shared:
            src = pad if pad is not None else k
            sk = op("Squeeze", op("Shape", src, start=1 if pad is not None else 2, end=2 if pad is not None else 3),
                    c("axes0", np.array([0], np.int64)))
            w = op("Reshape", window, c("scalar", np.array([], np.int64)))
            zero, one = c("i0", np.array(0, np.int64)), c("i1", np.array(1, np.int64))
            w = op("Where", op("LessOrEqual", w, zero), sk, w)  # 0: full; w >= S_k already admits every key
            pos = op("Range", zero, sk, one)
            qpos = op("Unsqueeze", pos, c("axes1", np.array([1], np.int64)))  # [S_k, 1]
            kpos = op("Unsqueeze", pos, c("axes0", np.array([0], np.int64)))  # [1, S_k]
            ok = op("Less", op("Abs", op("Sub", qpos, kpos)), w)
            if sinks:
                ok = op("Or", ok, op("Less", kpos, c(f"sinks{sinks}", np.array(sinks, np.int64))))
            if causal:
                ok = op("And", ok, op("LessOrEqual", kpos, qpos))  # [S_k, S_k]
            if pad is not None:
                pb = op("Unsqueeze", op("Cast", pad, to=ir.DataType.BOOL), c("axes12", np.array([1, 2], np.int64)))
                ok = op("And", ok, pb)  # [B, 1, S_k, S_k]
            bias = op("Where", ok, c("f0", np.array(0.0, np.float32)), c("fneg", np.array(-1e30, np.float32)))
            any_ok = op("ReduceMax", op("Cast", ok, to=ir.DataType.FLOAT), c("axesm1", np.array([-1], np.int64)),
                        keepdims=1)  # [(B,) 1, S_k, 1]
            shared[key] = (ok, bias, any_ok)
        ok, bias, any_ok = shared[key]
        if not (q.shape[2] == k.shape[2]):  # queries are the last S_q positions: take those mask rows
            sq_v = op("Shape", q, start=2, end=3)
            sk_v = op("Shape", k, start=2, end=3)
            rows = (op("Sub", sk_v, sq_v), sk_v, c("axesm2", np.array([-2], np.int64)))
            ok, bias, any_ok = op("Slice", ok, *rows), op("Slice", bias, *rows), op("Slice", any_ok, *rows)
        graph.insert_before(node, new)  # the mask, then ONNX Runtime's fused kernel or the plain ops
        mask = fused_attention.Mask(ok, bias, any_ok, padded=pad is not None)
        why = fused_attention.fuse(graph, node, mask, scale)
        if why is None:
            lowered += 1
            continue
        plain[node.name or "WindowedAttention"] = why
        mask_nodes = len(new)
        qs = op("Mul", q, c(f"scale_{scale:.9g}", np.array(scale, np.float32)))
        g = h // hkv
        if g > 1:  # GQA: the G query heads of a kv head become G*S_q rows of one GEMM
            qs = op("Reshape", qs, c(f"shape_gqa_{hkv}_{d}", np.array([0, hkv, -1, d], np.int64)))
        scores = op("MatMul", qs, op("Transpose", k, perm=[0, 1, 3, 2]))
        if g > 1:
            scores = op("Reshape", scores, c(f"shape_heads_{h}", np.array([0, h, -1, 0], np.int64)))
        probs = op("Softmax", op("Add", scores, bias), axis=-1)  # [B, H, S_q, S_k]
        if g > 1:
            probs = op("Reshape", probs, c(f"shape_gqa_{hkv}_0", np.array([0, hkv, -1, 0], np.int64)))
        out = op("MatMul", probs, v)
        if g > 1:
            out = op("Reshape", out, c(f"shape_heads_{h}_{d}", np.array([0, h, -1, d], np.int64)))
        out = op("Mul", out, any_ok)  # rows with no key at all: zeros
        graph.insert_before(node, new[mask_nodes:])
        out.shape, out.dtype = node.outputs[0].shape, node.outputs[0].dtype
        replace_value(graph, node.outputs[0], out)
        graph.remove(node, safe=True)
        lowered += 1
    if lowered > len(plain):  # the fused layers' head splits, merges and op nodes
        model.opset_imports.setdefault(fused_attention.MS, 1)
        common.RemoveUnusedNodesPass()(model)
    return lowered, kept, plain


def _inline_and_share(model: ir.Model) -> int:
    """Inline the op (ONNX Runtime would anyway) and merge the identical per-layer mask computations."""
    nodes = sum(1 for n in model.graph.all_nodes() if n.domain == DOMAIN and n.op_type == OP_TYPE)
    for p in (common.InlinePass(), common.CommonSubexpressionEliminationPass(), common.RemoveUnusedNodesPass(),
              common.RemoveUnusedFunctionsPass()):
        p(model)
    model.opset_imports.pop(DOMAIN, None)
    return nodes
