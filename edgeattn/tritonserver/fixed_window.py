"""The model.onnx of an `onnxruntime_onnx` repository: the bundle's artifact with its attention window fixed.

Triton has no scalar tensors ("scalar tensors are not supported" for a model without batching; with batching,
every input gains the batch axis), and the onnxruntime backend hands the graph exactly the tensor Triton
assembled: it cannot turn a per-request window into the graph's scalar, and a graph that reduced a `[batch, 1]`
window to one value would give the requests of a batch that asked for other windows a wrong answer (Triton's
dynamic batcher batches requests whatever their values). So the window input becomes a constant of the graph,
set at export (`--window`, 0 = full attention), and the model batches like any encoder. Per-request windows are
the Python backend's (`--cpu-backend python`), which runs each window of a batch separately.
"""

from __future__ import annotations

from pathlib import Path

from edgeattn.errors import ModelError


def write_fixed_window(artifact: Path, out: Path, input_name: str, window: int) -> None:
    """Copy the ONNX model `artifact` to `out` with graph input `input_name` replaced by the constant `window`."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(artifact))
    graph = model.graph
    found = [i for i in graph.input if i.name == input_name]
    if not found:
        raise ModelError(f"{artifact}: expected a graph input {input_name!r} (the attention window), found "
                         f"{[i.name for i in graph.input]}")
    elem = found[0].type.tensor_type.elem_type
    dims = [d.dim_value or 1 for d in found[0].type.tensor_type.shape.dim]
    value = np.full(dims, window, dtype=onnx.helper.tensor_dtype_to_np_dtype(elem))
    graph.input.remove(found[0])
    graph.initializer.append(numpy_helper.from_array(value, input_name))
    onnx.save(model, str(out))
