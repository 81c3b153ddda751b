"""Where each `edgeattn::WindowedAttention` node (and its cached form, `CachedWindowedAttention`, in decoders)
goes in a TensorRT build: the plugin, or the portable body.

The plugin form of a node is the same node with `plugin_namespace="edgeattn"` (the ONNX parser then
asks the plugin registry first); without it the parser inlines the node's ONNX local function.
Every node that does not go to the plugin says why.
"""

from __future__ import annotations

import onnx_ir as ir

from edgeattn.errors import BuildError

DOMAIN, OP, CACHED_OP = "edgeattn", "WindowedAttention", "CachedWindowedAttention"
PLUGIN_ATTR = "plugin_namespace"


def attention_nodes(graph: ir.Graph) -> list[ir.Node]:
    return [n for n in graph.all_nodes() if n.domain == DOMAIN and n.op_type in (OP, CACHED_OP)]


def _cached_misfit(node: ir.Node) -> str | None:
    if len(node.inputs) not in (8, 10):
        return (f"expected 8 inputs (q, q_sink, k, v, past_key, past_value, cache_position, window), or 10 with "
                f"the attention budget's (pages, key_bounds), found {len(node.inputs)}")
    for value in node.inputs[6:9]:
        if value is not None and value.dtype is not None and value.dtype != ir.DataType.INT64:
            return f"{value.name} is {value.dtype.name}: the plugin takes int64 positions, window and pages"
    if len(node.inputs) == 10:
        bounds, cache = node.inputs[9], node.inputs[4]
        if bounds is not None and bounds.shape is not None and len(bounds.shape) != 5:
            return f"key_bounds has rank {len(bounds.shape)}: the plugin takes [B, H_kv, P, 2, D]"
        if None not in (bounds, cache) and None not in (bounds.dtype, cache.dtype) and bounds.dtype != cache.dtype:
            return (f"key_bounds is {bounds.dtype.name} and the cache {cache.dtype.name}: the plugin takes bounds of "
                    f"the cache's type")
    if node.attributes.get_float("softcap", 0.0):
        return "its scores are soft-capped (softcap), which the plugin does not do"
    return None


def _misfit(node: ir.Node) -> str | None:
    """Why the plugin cannot take this node, or None."""
    if node.op_type == CACHED_OP:
        return _cached_misfit(node)
    if len(node.inputs) not in (4, 5):
        return f"expected 4 or 5 inputs (q, k, v, window[, key_padding_mask]), found {len(node.inputs)}"
    for name, value in zip(("q", "k", "v"), node.inputs[:3]):
        if value is not None and value.shape is not None and len(value.shape) != 4:
            return f"{name} has rank {len(value.shape)}: the plugin takes [B, H, S, D]"
    window = node.inputs[3]
    if window is not None and window.dtype is not None and window.dtype not in (ir.DataType.INT64, ir.DataType.INT32):
        return f"window is {window.dtype.name}: the plugin takes an int64 scalar"
    return None


def map_attention(model: ir.Model, use_plugin: bool, why_not: str = "") -> list[dict]:
    """Mark each attention node for the plugin or the body (in place); one record per node."""
    bodies = {f.name for f in model.functions.values() if f.domain == DOMAIN}
    records = []
    for i, node in enumerate(attention_nodes(model.graph)):
        node.name = node.name or f"windowed_attention_{i}"
        has_body = node.op_type in bodies
        reason = _misfit(node) if use_plugin else (why_not or "the target has no attention plugin")
        if reason is None:
            node.attributes[PLUGIN_ATTR] = ir.AttrString(PLUGIN_ATTR, DOMAIN)
            records.append({"node": node.name, "to": "plugin"})
            continue
        node.attributes.pop(PLUGIN_ATTR, None)
        if not has_body:
            raise BuildError(f"attention node {node.name!r} cannot go to the plugin ({reason}) and the model has "
                             f"no {DOMAIN}::{node.op_type} local function to fall back on")
        records.append({"node": node.name, "to": "body", "reason": reason})
    return records
