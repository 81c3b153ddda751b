"""Graph edits the passes share: rewire a value's readers, add a named constant."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

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


def anchored(graph: ir.Graph, op_type: str, match: Callable[[ir.Node], Any], unfused: list[dict], *,
             ignore: str) -> Iterator[tuple[ir.Node, Any]]:
    """Nodes of `op_type` (default domain) that `match` accepts, with what it found. A node it refuses with a
    reason that does not start with `ignore` (not the pattern at all) is a near miss: {"node", "reason"} goes
    to `unfused`, so the pass can say why it did not fire."""
    for node in [n for n in graph if n.op_type == op_type and n.domain == ""]:
        found = match(node)
        if isinstance(found, str):
            if not found.startswith(ignore):
                unfused.append({"node": node.name, "reason": found})
            continue
        yield node, found
