"""The 2:4 graph check on ONNX models made in code: MatMul, Gemm, Conv, behind DequantizeLinear/Transpose."""

import json

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeattn.bundle.build import BuildConfig, build
from edgeattn.cli.main import cli
from edgeattn.passes import PassContext
from edgeattn.passes.check_sparsity import DECISIONS_KEY, METADATA_KEY, CheckSparsity, check_model, groups_ok
from edgeattn.targets import get_target

K, N = 16, 8


def _two_four(shape, axis, seed=0):
    """float32 array with exactly 2 zeros in every 4 along `axis` (NumPy reference construction)."""
    rng = np.random.default_rng(seed)
    w = np.moveaxis(rng.standard_normal(shape).astype(np.float32), axis, -1).copy()
    g = w.reshape(-1, 4)
    g[:, [1, 2]] = 0
    return np.moveaxis(g.reshape(w.shape), -1, axis).copy()


def _model(broken: bool = False, expected: list[str] | None = None, decisions: dict | None = None) -> onnx.ModelProto:
    mm = _two_four((K, N), 0)  # MatMul B: [K, N], reduce axis 0
    gemm = _two_four((N, K), 1, seed=1)  # Gemm transB=1: [N, K], reduce axis 1
    conv = _two_four((N, K, 1, 1), 1, seed=2)  # Conv: [O, C, 1, 1], reduce axis 1
    q = np.round(_two_four((K, N), 0, seed=3) * 40).clip(-127, 127).astype(np.int8)  # int8 behind DQ
    tw = _two_four((N, K), 1, seed=4)  # stored [N, K], transposed to MatMul's [K, N]
    dense = np.random.default_rng(5).standard_normal((K, N)).astype(np.float32)
    odd = np.random.default_rng(6).standard_normal((6, N)).astype(np.float32)
    if broken:
        mm[1, 3] = 0.5  # the group mm[0:4, 3] now holds one zero
    inits = [numpy_helper.from_array(a, n) for a, n in [
        (mm, "mm.weight"), (gemm, "gemm.weight"), (conv, "conv.weight"), (q, "q.weight"),
        (np.full(N, 0.02, np.float32), "q.scale"), (np.zeros(N, np.int8), "q.zero"), (tw, "t.weight"), (dense, "dense.weight"), (odd, "odd.weight")]]
    nodes = [
        helper.make_node("MatMul", ["x", "mm.weight"], ["a"], name="mm"),
        helper.make_node("Gemm", ["x2d", "gemm.weight"], ["b"], name="gemm", transB=1),
        helper.make_node("Conv", ["x4", "conv.weight"], ["c"], name="conv"),
        helper.make_node("DequantizeLinear", ["q.weight", "q.scale", "q.zero"], ["qw"], name="dq", axis=1),  # per channel
        helper.make_node("MatMul", ["x", "qw"], ["d"], name="qmm"),
        helper.make_node("Transpose", ["t.weight"], ["tt"], name="tr", perm=[1, 0]),
        helper.make_node("MatMul", ["x", "tt"], ["e"], name="tmm"),
        helper.make_node("MatMul", ["x", "dense.weight"], ["f"], name="dmm"),
        helper.make_node("MatMul", ["a", "y"], ["g"], name="act_act"),
        helper.make_node("MatMul", ["x6", "odd.weight"], ["h"], name="odd"),
    ]
    graph = helper.make_graph(nodes, "sparse", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, K]),
        helper.make_tensor_value_info("x2d", TensorProto.FLOAT, [2, K]),
        helper.make_tensor_value_info("x4", TensorProto.FLOAT, [2, K, 1, 1]),
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [N, 3]),
        helper.make_tensor_value_info("x6", TensorProto.FLOAT, [2, 6])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [2, N, 1, 1] if o == "c" else [2, 3] if o == "g" else [2, N])
         for o in "abcdefgh"], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    if expected is not None:
        model.metadata_props.add(key=METADATA_KEY, value=json.dumps(expected))
    if decisions is not None:
        model.metadata_props.add(key=DECISIONS_KEY, value=json.dumps(decisions))
    return model


def _by_node(model):
    return {e.node: e for e in check_model(ir.serde.deserialize_model(model))}


def test_every_weight_kind_is_found_and_judged():
    model = _model()
    onnx.checker.check_model(model)
    feeds = {"x": np.ones((2, K), np.float32), "x2d": np.ones((2, K), np.float32),
             "x4": np.ones((2, K, 1, 1), np.float32), "y": np.ones((N, 3), np.float32),
             "x6": np.ones((2, 6), np.float32)}
    ort.InferenceSession(model.SerializeToString()).run(None, feeds)  # a real, valid graph
    got = _by_node(model)
    assert {n: e.status for n, e in got.items()} == {
        "mm": "sparse", "gemm": "sparse", "conv": "sparse", "qmm": "sparse", "tmm": "sparse",
        "dmm": "dense", "act_act": "skipped", "odd": "skipped"}
    assert got["gemm"].axis == 1 and got["mm"].axis == 0 and got["conv"].axis == 1
    assert got["tmm"].axis == 1 and "Transpose" in got["tmm"].reason  # reduction axis mapped through perm
    assert "DequantizeLinear" in got["qmm"].reason
    assert "not a constant" in got["act_act"].reason
    assert "not a multiple of 4" in got["odd"].reason


def test_a_weight_broken_on_purpose_is_named():
    got = _by_node(_model(broken=True))
    assert got["mm"].status == "broken" and got["mm"].layer == "mm.weight"
    assert "fewer than 2 zeros" in got["mm"].reason


def test_metadata_marks_layers_that_must_be_sparse():
    got = _by_node(_model(expected=["dense.weight"]))
    assert got["dmm"].status == "broken" and "marked sparse" in got["dmm"].reason


def test_groups_ok_matches_a_float64_reference():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((8, 12)) * (rng.random((8, 12)) > 0.5)
    ref = np.mean([(a[i, j:j + 4] == 0).sum() >= 2 for i in range(8) for j in range(0, 12, 4)])
    assert groups_ok(a, 1) == pytest.approx(ref)


def test_pass_enables_sparse_weights_only_on_sparse_targets():
    decisions = {"mm": {"pruned": True, "basis": "measured table", "reason": "gains: 1.4x"}}
    model = ir.serde.deserialize_model(_model(broken=True, decisions=decisions))
    on_h100 = CheckSparsity()(model, PassContext(get_target("h100")))
    on_cpu = CheckSparsity()(model, PassContext(get_target("cpu")))
    assert on_h100.details["enable_sparse_weights"] is True and on_cpu.details["enable_sparse_weights"] is False
    assert on_h100.details["sparse_layers"] == ["gemm.weight", "conv.weight", "q.weight", "t.weight"]
    assert "no sparse tensor cores" in on_cpu.summary
    assert len(on_h100.problems) == 1 and "mm.weight" in on_h100.problems[0]
    assert not on_h100.changed
    assert on_h100.details["sparsify_decisions"] == decisions  # sparsify's per-layer decisions reach the manifest


def test_build_manifest_reports_sparse_layers(tmp_path, tiny_onnx):
    model = onnx.load(str(tiny_onnx))
    w1 = next(i for i in model.graph.initializer if i.name == "w1")
    w1.CopyFrom(numpy_helper.from_array(_two_four(tuple(w1.dims), 0), "w1"))
    onnx.save(model, str(tiny_onnx))
    bundle = build(tiny_onnx, BuildConfig(target="cpu"))
    section = next(p for p in bundle.manifest.sections["passes"] if p["name"] == "check-sparsity")
    assert section["details"]["sparse_layers"] == ["w1"]
    assert section["details"]["enable_sparse_weights"] is False


def test_cli_json_and_failure_exit(tmp_path, runner):
    good, bad = tmp_path / "good.onnx", tmp_path / "bad.onnx"
    onnx.save(_model(), str(good))
    onnx.save(_model(broken=True), str(bad))
    result = runner.invoke(cli, ["check-sparsity", str(good), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["ok"] and len(data["sparse_layers"]) == 5
    result = runner.invoke(cli, ["check-sparsity", str(bad)])
    assert result.exit_code == 2 and "mm.weight" in result.output and "broken" in result.output
    result = runner.invoke(cli, ["check-sparsity", str(good), "--require-all"])
    assert result.exit_code == 2 and "dense.weight" in result.output
