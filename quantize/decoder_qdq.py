"""Quantized decoders: a fake-quantized (QAT) causal LM exported with the cache (edgeattn.decoder), as Q/DQ ONNX.

The same decoder export (`export_decoder_model`) with every QuantLinear frozen for export, so each becomes
MatMul(DQ(Q(x)), DQ(W)) as in `edgeattn.quantize.qdq_export`; INT4 weights are packed after the export.
`edgeattn build` then lowers it for the target (cpu: integer MatMuls, or MatMulNBits for INT4)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import onnx
import onnx_ir as ir

from edgeattn import atomic
from edgeattn.decoder.export import DecoderExportConfig, export_decoder_model
from edgeattn.errors import BuildError
from edgeattn.quantize.qdq_export import export_opset, frozen_for_export, pack_int4, qdq_summary


def export_decoder_qdq(model, tokenizer, out: str | Path, config: DecoderExportConfig = DecoderExportConfig()) -> dict:
    """Write the Q/DQ decoder ONNX of a fake-quantized model; returns the Q/DQ structure summary."""
    with frozen_for_export(model, "export_decoder_qdq") as layers:
        path = export_decoder_model(model, tokenizer, out, replace(config, opset=max(config.opset, export_opset(model))))
    ir_model = ir.serde.deserialize_model(onnx.load(str(path)))
    summary = {**qdq_summary(ir_model), "int4_packed": pack_int4(ir_model)}
    if summary["quantized_matmuls"] != summary["weight_dq"] or summary["weight_dq"] < len(layers) - 1:
        raise BuildError(f"decoder Q/DQ export: expected every quantized Linear ({len(layers)}) as DQ -> MatMul, "
                         f"found {summary['weight_dq']} weight DQ and {summary['quantized_matmuls']} quantized MatMuls")
    atomic.write_bytes(Path(path), ir.serde.serialize_model(ir_model).SerializeToString())
    return summary
