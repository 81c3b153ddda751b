"""The fp16/bf16 cast of a graph (checked in ONNX Runtime against fp32), profile splitting, layer-log parsing."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

import trt_fixtures as fx
from edgeattn.engines.tensorrt import layers as trt_layers
from edgeattn.errors import BuildError
from edgeattn.engines.tensorrt.float_cast import cast_float_parts
from edgeattn.onnx_model import TensorSpec
from edgeattn.shapes import ShapePlan
from edgeattn.engines.tensorrt.profiles import dim_profiles, input_shapes, split_range


def _run(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _cast(model: onnx.ModelProto, precision="fp16") -> tuple[onnx.ModelProto, dict]:
    m = ir.serde.deserialize_model(model)
    result = cast_float_parts(m, precision)
    out = ir.serde.serialize_model(m)
    onnx.checker.check_model(out)
    return out, result.as_dict()


@pytest.mark.parametrize("make", [fx.mlp, fx.attention, lambda: fx.int8_qdq(opset=19)])
def test_fp16_cast_keeps_io_and_matches_fp32(make):
    model = make()
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 5, fx.HIDDEN)).astype(np.float32)}
    if any(i.name == "window" for i in model.graph.input):
        feeds["window"] = np.array(0, np.int64)
    want = _run(model, feeds)
    cast, summary = _cast(model)
    got = _run(cast, feeds)
    assert got.dtype == np.float32 and got.shape == want.shape  # declared I/O types kept
    assert summary["boundary_casts"] == ["x", "y"] and summary["initializers"] >= 2
    inits = {t.name: t.data_type for t in cast.graph.initializer}
    assert onnx.TensorProto.FLOAT not in inits.values()
    np.testing.assert_allclose(got, want, atol=2e-2, rtol=2e-2)
    assert np.abs(got - want).max() > 0  # it really ran in fp16


def test_bf16_cast_rounds_weights_to_bf16():
    # ONNX Runtime has no CPU bf16 MatMul: check the weights against float32 within bf16's 8-bit mantissa
    model = fx.mlp()
    cast, _ = _cast(model, "bf16")
    assert {t.data_type for t in cast.graph.initializer} == {onnx.TensorProto.BFLOAT16}
    assert cast.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    want = onnx.numpy_helper.to_array(model.graph.initializer[0])
    got = onnx.numpy_helper.to_array(cast.graph.initializer[0]).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=2 ** -8, atol=0)
    assert not np.array_equal(got, want)


def test_function_body_constants_are_cast():
    cast, _ = _cast(fx.attention())
    body = cast.functions[0]
    casts = [n for n in body.node if n.op_type == "Cast"]
    assert casts and all(a.i == onnx.TensorProto.FLOAT16 for n in casts for a in n.attribute if a.name == "to")


def test_qdq_below_opset_19_is_refused():
    with pytest.raises(BuildError, match="needs opset >= 19"):
        _cast(fx.int8_qdq(opset=13))


def test_split_range_and_profiles():
    assert split_range((1, 4, 8)) == [(1, 4, 8)]  # narrow: one profile
    assert split_range((1, 128, 512)) == [(1, 22, 22), (22, 128, 512)]
    plan = ShapePlan({"batch": (1, 1, 64), "seq": (1, 128, 512)}, {"batch": "batch", "seq": "seq"})
    profiles = dim_profiles(plan)
    assert len(profiles) == 4
    first = profiles[0]  # holds the opt sizes
    assert first["batch"][0] <= 1 <= first["batch"][2] and first["seq"][0] <= 128 <= first["seq"][2]
    shapes = input_shapes((TensorSpec("ids", "int64", ("batch", "seq")), TensorSpec("w", "int64", ())), first)
    assert shapes == {"ids": [[1, 22], [1, 128], [8, 512]]}


LOG = """Layers:
Name: fc1_myl0_2, LayerType: gemm, Inputs: [ { Name: a, Dimensions: [-1,64], Datatype: Int8, Format: x }, { Name: w, Dimensions: [64,64], Datatype: Int8, Format: x }], Constants: [ { Name: alpha, Dimensions: [1], Datatype: Float, Format: x }], Outputs: [ { Name: h, Dimensions: [-1,64], Datatype: Half, Format: x }], TacticName: __myelin_CASK_STUB, StreamId: 0, Metadata: [ONNX Layer: fc1][ONNX Layer: dq_w1]
Name: __myl_Fc_myl0_3, LayerType: runtime_fusion, Inputs: [ { Name: h, Datatype: Half, Format: x }], Constants: [ { Name: w2, Datatype: Int4, Format: x }], Outputs: [ { Name: y, Datatype: Half, Format: x }], TacticName: , StreamId: 0, Metadata: [ONNX Layer: fc2]
Name: fc1 [profile 1]_myl1_2, LayerType: gemm, Inputs: [ { Name: a, Datatype: Float, Format: x }], Constants: [], Outputs: [ { Name: h, Datatype: Float, Format: x }], TacticName: t, StreamId: 0, Metadata: [ONNX Layer: node_of_s | attn0 (WindowedAttention)]
I/O Tensors:
"""


def test_layer_log_parsing():
    rows = trt_layers.from_log(LOG)
    assert [(r["name"], r["precision"], r["profile"]) for r in rows] == [
        ("fc1_myl0_2", "int8", 0), ("__myl_Fc_myl0_3", "int4+fp16", 0), ("fc1 [profile 1]_myl1_2", "fp32", 1)]
    assert rows[0]["onnx_nodes"] == ["fc1", "dq_w1"] and rows[2]["onnx_nodes"] == ["node_of_s (in attn0 (WindowedAttention))"]
    assert rows[0]["compute"] and not rows[1]["compute"]
    trt_layers.mark_compute(rows, {"fc2"})
    assert rows[1]["compute"]
    assert trt_layers.summarize(rows) == {"compute_layers": {"int8": 1, "int4+fp16": 1}, "fp32_layers": [], "layers": 2}
