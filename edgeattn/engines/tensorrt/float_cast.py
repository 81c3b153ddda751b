"""Cast the float parts of an ONNX graph to fp16 or bf16 (strongly typed TensorRT: precision lives in the graph).

`--precision fp16` cannot be a builder flag any more (TensorRT 11 and TensorRT for RTX are strongly typed),
so the graph itself becomes fp16: float32 initializers and constants, `Cast(to=float)`, and every float
value. Graph inputs and outputs keep their declared float32 type through a Cast at the boundary, so the
manifest's signature stays true. Quantized weights (int8/int4/fp8 Q/DQ) stay quantized; their scales
become fp16, which ONNX allows from opset 19 only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from edgeattn.errors import BuildError

TARGET_TYPES = {"fp16": ir.DataType.FLOAT16, "bf16": ir.DataType.BFLOAT16}
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
# inputs that the ONNX standard types as float32 whatever the graph's float type is: (op, input index)
KEEP_FLOAT32 = {("Resize", 2)}


@dataclass
class CastResult:
    float_type: str
    initializers: int = 0
    constants: int = 0
    values: int = 0
    boundary_casts: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"float_type": self.float_type, "initializers": self.initializers, "constants": self.constants,
                "values": self.values, "boundary_casts": self.boundary_casts}


def _to_type(tensor: ir.TensorProtocol, dtype: ir.DataType, name: str) -> ir.Tensor:
    array = tensor.numpy().astype(np.float32)
    if dtype == ir.DataType.FLOAT16:
        # finite values beyond fp16's range (e.g. -3.4e38 mask fillers) saturate instead of becoming inf
        limit = float(np.finfo(np.float16).max)
        array = np.where(np.isfinite(array), np.clip(array, -limit, limit), array)
        return ir.tensor(array.astype(np.float16), name=name)
    import ml_dtypes

    return ir.tensor(array.astype(ml_dtypes.bfloat16), dtype=ir.DataType.BFLOAT16, name=name)


def _kept_float32(value: ir.Value) -> bool:
    return any((use.node.op_type, use.idx) in KEEP_FLOAT32 for use in value.uses())


def _convert_node_attributes(node: ir.Node, dtype: ir.DataType, result: CastResult) -> None:
    attrs = node.attributes
    if node.op_type == "Cast" and attrs.get("to") is not None and attrs["to"].value == ir.DataType.FLOAT:
        attrs["to"] = ir.AttrInt64("to", int(dtype))
    elif node.op_type in ("Constant", "ConstantOfShape") and "value" in attrs:
        tensor = attrs["value"].value
        if tensor.dtype == ir.DataType.FLOAT and not any(_kept_float32(o) for o in node.outputs):
            attrs["value"] = ir.AttrTensor("value", _to_type(tensor, dtype, tensor.name or "value"))
            result.constants += 1
    elif node.op_type == "Constant" and ("value_float" in attrs or "value_floats" in attrs):
        key = "value_float" if "value_float" in attrs else "value_floats"
        array = np.asarray(attrs.pop(key).value, dtype=np.float32)
        attrs["value"] = ir.AttrTensor("value", _to_type(ir.tensor(array), dtype, "value"))
        result.constants += 1
    elif node.op_type in ("EyeLike", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike") \
            and attrs.get("dtype") is not None and attrs["dtype"].value == ir.DataType.FLOAT:
        attrs["dtype"] = ir.AttrInt64("dtype", int(dtype))


def _cast(value: ir.Value, dtype: ir.DataType, name: str) -> ir.Node:
    node = ir.node("Cast", [value], {"to": dtype}, name=name)
    node.outputs[0].name = name
    node.outputs[0].dtype = dtype
    node.outputs[0].shape = value.shape
    return node


def cast_float_parts(model: ir.Model, precision: str) -> CastResult:
    """Rewrite `model` in place so its float computation runs in `precision` (fp16 or bf16)."""
    dtype = TARGET_TYPES[precision]
    graph = model.graph
    opset = model.opset_imports.get("", 0)
    result = CastResult(precision)
    if opset < 19 and any(n.op_type in QDQ_OPS for n in graph.all_nodes()):
        raise BuildError(f"--precision {precision} on a Q/DQ graph needs opset >= 19 ({precision} Q/DQ scales "
                         f"are legal ONNX only from opset 19), found opset {opset}: re-export with opset 19 or "
                         f"build with --precision fp32")
    for value in list(graph.initializers.values()):
        if value.dtype == ir.DataType.FLOAT and not _kept_float32(value):
            value.const_value = _to_type(value.const_value, dtype, value.name)
            value.dtype = dtype
            result.initializers += 1
    nodes = list(ir.traversal.RecursiveGraphIterator(graph))
    for function in model.functions.values():
        nodes += list(function)
    for node in nodes:
        _convert_node_attributes(node, dtype, result)
        for out in node.outputs:
            if out.dtype == ir.DataType.FLOAT and not _kept_float32(out):
                out.dtype = dtype
                result.values += 1
    # keep the declared float32 inputs and outputs: a Cast at each boundary
    for value in graph.inputs:
        if value.dtype != ir.DataType.FLOAT:
            continue
        uses = list(value.uses())
        cast = _cast(value, dtype, f"{value.name}__to_{precision}")
        graph.insert_before(graph.node(0), cast) if graph.num_nodes() else graph.append(cast)
        for use in uses:
            use.node.replace_input_with(use.idx, cast.outputs[0])
        result.boundary_casts.append(value.name)
    for i, value in enumerate(list(graph.outputs)):
        if value.dtype != dtype:
            continue
        name = value.name
        value.name = f"{name}__{precision}"
        cast = _cast(value, ir.DataType.FLOAT, name)
        graph.append(cast)
        graph.outputs[i] = cast.outputs[0]
        result.boundary_casts.append(name)
    return result
