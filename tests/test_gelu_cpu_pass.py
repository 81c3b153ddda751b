"""The fuse-gelu-cpu pass: exact GELU spellings become com.microsoft.Gelu, with the same outputs in ORT."""

import math

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeattn.passes import PassContext
from edgeattn.passes.plans import plan_for
from edgeattn.passes.gelu_cpu import FuseGeluForCpu
from edgeattn.targets import get_target


def c(name, value):
    return numpy_helper.from_array(np.array(value, np.float32), name)


def gelu_model(order: str, divide: bool = True, half: float = 0.5) -> onnx.ModelProto:
    scale = ("Div", "sqrt2") if divide else ("Mul", "inv_sqrt2")
    nodes = [helper.make_node("MatMul", ["a", "w"], ["x"]),
             helper.make_node(scale[0], ["x", scale[1]], ["s"]),
             helper.make_node("Erf", ["s"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["p"])]
    if order == "half_first":  # dynamo's spelling: x * (0.5 * (erf + 1))
        nodes += [helper.make_node("Mul", ["half", "p"], ["h"]), helper.make_node("Mul", ["x", "h"], ["y"])]
    else:  # (x * (erf + 1)) * 0.5
        nodes += [helper.make_node("Mul", ["x", "p"], ["h"]), helper.make_node("Mul", ["h", "half"], ["y"])]
    inits = [c("w", np.random.default_rng(0).standard_normal((8, 8))), c("sqrt2", math.sqrt(2)),
             c("inv_sqrt2", 1 / math.sqrt(2)), c("one", 1.0), c("half", half)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def run(model: onnx.ModelProto, a: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]


@pytest.mark.parametrize("order,divide", [("half_first", True), ("half_last", True), ("half_first", False)])
def test_gelu_is_fused_and_exact(order, divide):
    src = gelu_model(order, divide)
    model = ir.serde.deserialize_model(src)
    result = FuseGeluForCpu()(model, PassContext(get_target("cpu")))
    out = ir.serde.serialize_model(model)
    assert result.details["fused"] == 1 and not result.problems
    assert [n.op_type for n in out.graph.node] == ["MatMul", "Gelu"] and out.graph.output[0].name == "y"
    a = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    np.testing.assert_allclose(run(out, a), run(src, a), atol=1e-5)


def test_other_erf_uses_are_reported_not_fused():
    model = ir.serde.deserialize_model(gelu_model("half_first", half=0.25))
    result = FuseGeluForCpu()(model, PassContext(get_target("cpu")))
    assert result.details["fused"] == 0 and "left as separate ops" in result.problems[0]


def test_tensorrt_targets_are_skipped():
    model = ir.serde.deserialize_model(gelu_model("half_first"))
    plan = plan_for(get_target("h100").backend)  # TensorRT fuses GELU itself: not in its plan
    results = plan.only(tuple(n for n in plan.passes if n == FuseGeluForCpu.name)).run(model, PassContext(get_target("h100")))
    assert not any(r.changed for r in results) and FuseGeluForCpu.name not in plan.passes


def constants_as_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """The TorchScript exporter's spelling: scalars are Constant nodes, not initializers."""
    scalars = [t for t in model.graph.initializer if not t.dims]
    del model.graph.initializer[:]
    model.graph.initializer.append(c("w", np.random.default_rng(0).standard_normal((8, 8))))
    consts = [helper.make_node("Constant", [], [t.name], value=t) for t in scalars]
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(consts + nodes)
    return model


def test_constant_node_scalars_are_read():
    """Issue 20: 'Erf input is x Div None' when sqrt(2) came from a Constant node (TorchScript)."""
    src = constants_as_nodes(gelu_model("half_last", divide=True))
    model = ir.serde.deserialize_model(src)
    result = FuseGeluForCpu()(model, PassContext(get_target("cpu")))
    out = ir.serde.serialize_model(model)
    assert result.details["fused"] == 1 and not result.problems
    assert [n.op_type for n in out.graph.node] == ["MatMul", "Gelu"]
    a = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    np.testing.assert_allclose(run(out, a), run(src, a), atol=1e-5)


def test_gelu_op_of_opset_20_is_counted_as_native():
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["x"]), helper.make_node("Gelu", ["x"], ["y"])],
                              "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
                              [c("w", np.eye(8))])
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]))
    result = FuseGeluForCpu()(model, PassContext(get_target("cpu")))
    assert result.details == {"fused": 0, "native": 1, "unfused": 0} and "1 already the Gelu op" in result.summary
