"""Issue 19 item 15: a model exported in training mode is refused before building, with the nodes named
and the fix; --as-inference builds it with Dropout removed, checked against the source as inference.

Before the inference-mode pass such a build ran to the parity check and failed there ("differs by 2.05"),
on rtx in the parser. The real case: a small BERT exported by the dynamo exporter in train() mode.
"""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeattn.bundle.build import BuildConfig, build
from edgeattn.errors import InputError
from onnx_fixtures import requires_torch


def dropout_graph(training: bool = True, mask_used: bool = False) -> onnx.ModelProto:
    """y = Dropout(x @ w, 0.5, training_mode) @ w2, optionally with the dropout mask as a second output."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array(0.5, np.float32), "ratio"),
             numpy_helper.from_array(np.array(training), "training")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Dropout", ["h", "ratio", "training"], ["d", "m"], name="drop"),
             helper.make_node("MatMul", ["d", "w2"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])]
    if mask_used:
        outputs.append(helper.make_tensor_value_info("m", TensorProto.BOOL, ["batch", 8]))
    graph = helper.make_graph(nodes, "drop", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def save(model: onnx.ModelProto, path) -> str:
    onnx.save(model, str(path))
    return str(path)


def test_training_dropout_is_refused_before_building(tmp_path):
    path = save(dropout_graph(), tmp_path / "train.onnx")
    steps = []
    with pytest.raises(InputError, match=r"training-mode node\(s\): drop \(training_mode is true\).*model.eval\(\)"
                                         r".*--as-inference") as info:
        build(path, BuildConfig(target="cpu", out=tmp_path / "b", batch=(1, 2, 4)), progress=steps.append)
    assert type(info.value) is InputError  # not a BuildError from the parity check
    assert not any(s.startswith("engine") for s in steps) and not (tmp_path / "b").exists()


def test_as_inference_removes_dropout_and_matches_the_inference_source(tmp_path):
    src = dropout_graph()
    bundle = build(save(src, tmp_path / "train.onnx"),
                   BuildConfig(target="cpu", out=tmp_path / "b", batch=(1, 2, 4), as_inference=True))
    processed = onnx.load(str(bundle.path / "model.onnx"))
    assert "Dropout" not in [n.op_type for n in processed.graph.node]
    passes = {p["name"]: p for p in bundle.manifest.sections["passes"]}
    assert passes["inference-mode"]["changed"] and "built as inference" in passes["inference-mode"]["summary"]
    assert bundle.manifest.sections["parity"]["status"] == "pass"
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    sess = ort.InferenceSession(str(bundle.path / "model.onnx"), providers=["CPUExecutionProvider"])
    w, w2 = (numpy_helper.to_array(t) for t in src.graph.initializer[:2])
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], x @ w @ w2, rtol=1e-5, atol=1e-5)


def test_inference_dropout_is_left_alone(tmp_path):
    bundle = build(save(dropout_graph(training=False), tmp_path / "eval.onnx"),
                   BuildConfig(target="cpu", out=tmp_path / "b", batch=(1, 2, 4)))
    assert next(p for p in bundle.manifest.sections["passes"] if p["name"] == "inference-mode")["changed"] is False


def test_as_inference_refuses_a_graph_that_reads_the_dropout_mask(tmp_path):
    path = save(dropout_graph(mask_used=True), tmp_path / "mask.onnx")
    with pytest.raises(InputError, match="drop: its mask"):
        build(path, BuildConfig(target="cpu", out=tmp_path / "b", batch=(1, 2, 4), as_inference=True))


def test_cli_exit_code_and_message(tmp_path, runner):
    from edgeattn.cli.main import cli

    path = save(dropout_graph(), tmp_path / "train.onnx")
    result = runner.invoke(cli, ["build", path, "--target", "cpu", "--batch", "1:2:4", "--out", str(tmp_path / "b")])
    assert result.exit_code == 2 and "--as-inference" in result.output
    result = runner.invoke(cli, ["build", path, "--target", "cpu", "--batch", "1:2:4", "--out", str(tmp_path / "b"),
                                 "--as-inference"])
    assert result.exit_code == 0, result.output
    assert "built as inference (1 training node(s) rewritten)" in result.output


@pytest.fixture(scope="module")
def train_mode_export(tmp_path_factory):
    """A 2-layer BERT exported by the dynamo exporter with the module left in train() mode."""
    import torch

    from edgeattn.export import export_wrapper
    from test_fusion_models import _tiny

    model, _ = _tiny("bert", "eager")
    model.config._attn_implementation = "eager"

    encoder, _ = export_wrapper(model, "encoder")  # the exporter's own module, put back in train() mode
    ids = torch.randint(0, 1000, (2, 16))
    path = tmp_path_factory.mktemp("train") / "bert-train.onnx"
    program = torch.onnx.export(encoder.train(), (ids, torch.ones_like(ids)), dynamo=True, opset_version=18,
                                input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state"],
                                dynamic_axes={n: {0: "batch", 1: "seq"} for n in
                                              ("input_ids", "attention_mask", "last_hidden_state")})
    program.save(str(path))
    return path


@requires_torch
@pytest.mark.slow
def test_real_train_mode_export(train_mode_export, tmp_path):
    dropouts = [n.name for n in onnx.load(str(train_mode_export)).graph.node if n.op_type == "Dropout"]
    assert dropouts  # the exporter did write training Dropouts
    with pytest.raises(InputError, match=f"found {len(dropouts)} training-mode node") as info:
        build(train_mode_export, BuildConfig(target="cpu", out=tmp_path / "b", seq=(1, 16, 64)))
    assert dropouts[0] in str(info.value)
    bundle = build(train_mode_export, BuildConfig(target="cpu", out=tmp_path / "b", seq=(1, 16, 64),
                                                  as_inference=True, strict=True))
    parity = bundle.manifest.sections["parity"]
    assert parity["status"] == "pass" and parity["max_abs_diff"] <= 1e-4
    fused = next(p for p in bundle.manifest.sections["passes"] if p["name"] == "fuse-attention")["details"]["fused"]
    assert fused == 2
