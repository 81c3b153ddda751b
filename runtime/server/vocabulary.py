"""How many rows each index input may address: the table size of the Gather that reads it (embeddings).

An id outside 0..rows-1 makes ONNX Runtime fail with its internals in the message, and -1 silently reads
the last row; the service checks ids against these limits and answers 400 instead. The limits are read
once, at load, from the bundle's ONNX model (the processed `model.onnx` when the bundle keeps one, since
an optimized or engine artifact may have fused the Gather away).
"""

from __future__ import annotations

from pathlib import Path

import onnx

from edgeattn.bundle.folder import Bundle


def _candidates(bundle: Bundle) -> list[Path]:
    names = [n for n in bundle.manifest.files if n.endswith(".onnx")]
    names.sort(key=lambda n: (n != "model.onnx", n != bundle.manifest.artifact, n))
    return [bundle.file(n) for n in names]


def gather_limits(model: onnx.ModelProto) -> dict[str, int]:
    """{graph input: rows of the smallest initializer table a Gather (axis 0) indexes with it}."""
    tables = {t.name: (list(t.dims) or [0])[0] for t in model.graph.initializer}
    inputs = {i.name for i in model.graph.input}
    limits: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        data, indices = node.input[0], node.input[1]
        if axis == 0 and indices in inputs and data in tables:
            limits[indices] = min(tables[data], limits.get(indices, tables[data]))
    return limits


def index_limits(bundle: Bundle) -> dict[str, int]:
    """The limits of the first ONNX model in the bundle that has any ({} when none can be read)."""
    for path in _candidates(bundle):
        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception:  # not ONNX after all, or unreadable: the backend will say so when it loads
            continue
        limits = gather_limits(model)
        if limits:
            return limits
    return {}
