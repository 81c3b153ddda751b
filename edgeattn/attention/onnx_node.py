"""The edgeattn::WindowedAttention node, one form for every runtime.

ONNX Runtime runs the node through the local function attached to the model (`attach_function`);
TensorRT's ONNX parser dispatches a node with a `plugin_namespace` attribute to the registered plugin
(op_type WindowedAttention, namespace edgeattn) before it looks at local functions. So one exported
model serves both.
"""

from __future__ import annotations

import onnx
from onnx import helper

from edgeattn.attention import DOMAIN, OP_TYPE, OPSET_VERSION
from edgeattn.attention.onnx_function import function_proto
from edgeattn.errors import ConfigError, ModelError
from edgeattn.onnx_model import opset_of

PLUGIN_NAMESPACE = DOMAIN


def check_attributes(causal: int | bool, sinks: int, scale: float) -> None:
    if int(causal) not in (0, 1):
        raise ConfigError(f"causal: expected 0 or 1, found {causal}")
    if int(sinks) < 0:
        raise ConfigError(f"sinks: expected >= 0, found {sinks}")
    if float(scale) < 0:
        raise ConfigError(f"scale: expected >= 0 (0 = 1/sqrt(D)), found {scale}")


def make_node(q: str, k: str, v: str, window: str, key_padding_mask: str | None = None, *,
              out: str, causal: int | bool = 1, sinks: int = 0, scale: float = 0.0,
              name: str | None = None) -> onnx.NodeProto:
    """The node: inputs q, k, v, window, [key_padding_mask]; attributes causal, sinks, scale, plugin_namespace."""
    check_attributes(causal, sinks, scale)
    inputs = [q, k, v, window] + ([key_padding_mask] if key_padding_mask else [])
    return helper.make_node(OP_TYPE, inputs, [out], name=name, domain=DOMAIN, causal=int(causal),
                            sinks=int(sinks), scale=float(scale), plugin_namespace=PLUGIN_NAMESPACE)


def attach_function(model: onnx.ModelProto, body: str = "blocked") -> onnx.ModelProto:
    """Add the local function (for the model's default opset) and the edgeattn opset import, in place.
    body: "blocked" (cost follows the window) or "dense" (short sequences; see onnx_function).

    The body always reads a key padding mask: nodes given without one get an all-true mask [B, S_k]
    built from k's shape (ONNX Runtime cannot run a function body that names a missing input).
    """
    opset = opset_of(model)
    if opset < 18:
        raise ModelError(f"edgeattn::WindowedAttention's ONNX body needs opset >= 18, found opset {opset}")
    kept = [f for f in model.functions if not (f.domain == DOMAIN and f.name == OP_TYPE)]
    del model.functions[:]
    model.functions.extend(kept + [function_proto(opset, body)])
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, OPSET_VERSION))
    _fill_missing_masks(model.graph)
    if model.ir_version < 9:
        model.ir_version = 9  # function attribute defaults (attribute_proto) need IR 9
    return model


def _fill_missing_masks(graph: onnx.GraphProto) -> None:
    nodes = []
    for node in graph.node:
        if node.domain == DOMAIN and node.op_type == OP_TYPE and (len(node.input) < 5 or not node.input[4]):
            base = f"{node.name or node.output[0]}/all_keys"
            idx = helper.make_tensor(f"{base}/idx", onnx.TensorProto.INT64, [2], [0, 2])
            one = helper.make_tensor(f"{base}/one", onnx.TensorProto.BOOL, [1], [True])
            nodes += [helper.make_node("Shape", [node.input[1]], [f"{base}/k_shape"]),
                      helper.make_node("Constant", [], [f"{base}/idx"], value=idx),
                      helper.make_node("Gather", [f"{base}/k_shape", f"{base}/idx"], [f"{base}/b_sk"]),
                      helper.make_node("ConstantOfShape", [f"{base}/b_sk"], [base], value=one)]
            del node.input[4:]
            node.input.append(base)
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
