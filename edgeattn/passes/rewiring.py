"""Graph edits the passes share: rewire a value's readers, add a named constant."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir


def replace_value(graph: ir.Graph, old: ir.Value, new: ir.Value) -> None:
    """Every use of `old` reads `new`; a graph output keeps its name (so the model's interface stays)."""
    name, is_output = old.name, old in graph.outputs
    ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
    if is_output:
        old.name = f"{name}_replaced"
        new.name = name


def constant(graph: ir.Graph, name: str, value) -> ir.Value:
    """A named constant initializer; an existing one of that name is reused."""
    if name in graph.initializers:
        return graph.initializers[name]
    array = np.asarray(value)
    v = ir.Value(name=name, const_value=ir.tensor(array, name=name))
    v.shape, v.dtype = ir.Shape(array.shape), v.const_value.dtype
    graph.register_initializer(v)
    return v
