"""One graph edit the passes share: make every reader of a value read another one."""

from __future__ import annotations

import onnx_ir as ir


def replace_value(graph: ir.Graph, old: ir.Value, new: ir.Value) -> None:
    """Every use of `old` reads `new`; a graph output keeps its name (so the model's interface stays)."""
    name, is_output = old.name, old in graph.outputs
    ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
    if is_output:
        old.name = f"{name}_replaced"
        new.name = name
