"""Export a fake-quantized model as explicit, symmetric Q/DQ ONNX (what TensorRT 10/11 builds).

Every QuantLinear becomes MatMul(DQ(Q(x)), DQ(W)) [+ bias]: the weight is an int8 / int4 / fp8 constant
laid out [in, out] with per-output-channel scales (axis 1) or, for INT4, opset-21 block scales along the
input axis (axis 0); the activation gets a per-tensor Q->DQ pair. Zero points are 0, scales constants.
"""

from __future__ import annotations

import contextlib

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from torch import nn

from edgeattn import atomic
from edgeattn.errors import BuildError
from edgeattn.export import ExportConfig, export_module
from edgeattn.quantize.api import quant_linears


@contextlib.contextmanager
def frozen_for_export(model: nn.Module, who: str):
    """Every QuantLinear in export mode (Q/DQ nodes) inside the block; yields the (name, layer) list."""
    layers = quant_linears(model)
    if not layers:
        raise BuildError(f"{who}: the model has no quantized layers; call quantize_ and calibrate first")
    for _, m in layers:
        m.freeze_for_export()
    try:
        yield layers
    finally:
        for _, m in layers:
            m.exporting = False


def export_opset(model: nn.Module) -> int:
    """21 when any layer is INT4 block-wise (DequantizeLinear block_size), otherwise 19."""
    return 21 if any(m.fmt == "int4" for _, m in quant_linears(model)) else 19


def export_qdq(model: nn.Module, kind: str, out: str | Path, *, seq_len: int = 16) -> dict:
    """Write `model`'s Q/DQ ONNX to `out`; returns a structure summary (also checked here)."""
    with frozen_for_export(model, "export_qdq") as layers:
        path = export_module(model, kind, out, ExportConfig(opset=export_opset(model), seq_len=seq_len))
    proto = onnx.load(str(path))
    ir_model = ir.serde.deserialize_model(proto)
    packed = pack_int4(ir_model)
    summary = qdq_summary(ir_model)
    summary["int4_packed"] = packed
    summary["layers_not_in_graph"] = len(layers) - summary["weight_dq"]  # e.g. BERT's unused pooler
    if summary["quantized_matmuls"] != summary["weight_dq"]:
        raise BuildError(f"export: expected every weight DequantizeLinear ({summary['weight_dq']}) to feed a "
                         f"MatMul directly, found {summary['quantized_matmuls']}")
    atomic.write_bytes(Path(path), ir.serde.serialize_model(ir_model).SerializeToString())
    return summary


def pack_int4(model: ir.Model) -> int:
    """Turn the int8-held weights and zero points of block-wise DequantizeLinear into INT4 constants."""
    n = 0
    for node in model.graph:
        if node.op_type != "DequantizeLinear" or node.attributes.get("block_size") is None:
            continue
        for i in (0, 2):
            value = node.inputs[i]
            if value is None or value.const_value is None or value.dtype == ir.DataType.INT4:
                continue
            array = value.const_value.numpy().astype(np.int8)
            value.const_value = ir.Tensor(array.astype(ir.DataType.INT4.numpy()), name=value.name)
            value.dtype = ir.DataType.INT4
        n += 1
    return n


def qdq_summary(model: ir.Model) -> dict:
    """Count MatMuls whose weight input is DQ(constant) and whether their activation input is Q->DQ."""
    counts = {"matmuls": 0, "quantized_matmuls": 0, "activation_qdq": 0, "weight_types": {}, "nonzero_zero_points": 0,
              "weight_dq": 0}
    for node in model.graph:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and len(node.inputs) > 2 and node.inputs[2] is not None:
            zp = node.inputs[2].const_value
            if zp is None or np.any(zp.numpy().astype(np.float32) != 0):
                counts["nonzero_zero_points"] += 1
        if node.op_type == "DequantizeLinear" and node.inputs[0].const_value is not None:
            counts["weight_dq"] += 1
        if node.op_type not in ("MatMul", "Gemm"):
            continue
        counts["matmuls"] += 1
        w = node.inputs[1].producer()
        if w is None or w.op_type != "DequantizeLinear" or w.inputs[0].const_value is None:
            continue
        counts["quantized_matmuls"] += 1
        dtype = w.inputs[0].dtype.name
        counts["weight_types"][dtype] = counts["weight_types"].get(dtype, 0) + 1
        a = node.inputs[0].producer()
        if a is not None and a.op_type == "DequantizeLinear" and a.inputs[0].producer() is not None \
                and a.inputs[0].producer().op_type == "QuantizeLinear":
            counts["activation_qdq"] += 1
    return counts
