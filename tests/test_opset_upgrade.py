"""upgrade-opset: models at opsets 13-17 are upgraded to 18 before attention fusion, and the build says so.

Real TorchScript exports of a small BERT at every opset 13-17 (each under 2 s), the stock MiniLM export at
opset 17 (slow), and graphs written here for the cases the pass leaves alone.
"""

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeattn.bundle.build import BuildConfig, build
from edgeattn.errors import StrictModeError
from edgeattn.passes import PassContext
from edgeattn.passes.upgrade_opset import UpgradeOpset
from edgeattn.targets import get_target
from onnx_fixtures import requires_minilm, requires_torch
from test_fusion_reasons import attention_graph


def pass_details(bundle, name: str) -> dict:
    return next(p for p in bundle.manifest.sections["passes"] if p["name"] == name)


def at_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """attention_graph with a ReduceMean whose axes moved from an attribute to an input at opset 18."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    del model.graph.output[:]
    if opset < 18:
        model.graph.node.append(helper.make_node("ReduceMean", ["y"], ["z"], axes=[-1], keepdims=1))
    else:
        model.graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), "last"))
        model.graph.node.append(helper.make_node("ReduceMean", ["y", "last"], ["z"], keepdims=1))
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", "seq", 1]))
    model.opset_import[0].version = opset
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def run(model: onnx.ModelProto, feeds: dict) -> list:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def upgrade_pass(model: onnx.ModelProto, **options):
    ir_model = ir.serde.deserialize_model(model)
    result = UpgradeOpset()(ir_model, PassContext(get_target("cpu"), **options))
    return result, ir.serde.serialize_model(ir_model)


def test_opset_17_graph_is_upgraded_with_the_same_outputs():
    src = at_opset(attention_graph("padding"), 17)
    result, out = upgrade_pass(src)
    assert result.changed and result.details == {"from": 17, "to": 18} and "from opset 17 to 18" in result.summary
    assert out.opset_import[0].version == 18
    reduce = next(n for n in out.graph.node if n.op_type == "ReduceMean")
    assert len(reduce.input) == 2 and "axes" not in [a.name for a in reduce.attribute]  # an input from 18 on
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float32),
             "attention_mask": np.array([[1] * 5, [1, 1, 1, 0, 0]], np.int64)}
    np.testing.assert_allclose(run(out, feeds)[0], run(src, feeds)[0], atol=1e-6)


@pytest.mark.parametrize("opset,options,why", [
    (18, {}, "no upgrade needed"),
    (17, {"passes": ("cleanup",)}, "fuse-attention is not run"),
])
def test_models_that_need_no_upgrade_are_kept(opset, options, why):
    result, out = upgrade_pass(at_opset(attention_graph("padding"), opset), **options)
    assert not result.changed and why in result.summary and out.opset_import[0].version == opset


def test_model_without_attention_keeps_its_opset():
    from onnx_fixtures import tiny_model

    model = tiny_model(opset=17)
    result, out = upgrade_pass(model)
    assert not result.changed and "no attention" in result.summary and out.opset_import[0].version == 17


def test_opset_below_13_is_reported_not_upgraded(tmp_path):
    model = at_opset(attention_graph("padding"), 17)
    model.opset_import[0].version = 12  # Softmax and ReduceMean read the same way at 12 for this graph
    result, out = upgrade_pass(model)
    assert not result.changed and out.opset_import[0].version == 12
    assert "expected 13 or newer" in result.problems[0]


def test_strict_build_of_an_unupgraded_model_fails_in_the_pass(tmp_path):
    """Without upgrade-opset, fuse-attention counts the blocks it could not fuse; --strict fails there,
    before any engine is built."""
    path = tmp_path / "a17.onnx"
    onnx.save(at_opset(attention_graph("padding"), 17), str(path))
    passes = ("fuse-attention", "cleanup")
    bundle = build(path, BuildConfig(target="cpu", out=tmp_path / "b", seq=(1, 8, 16), passes=passes))
    fuse = pass_details(bundle, "fuse-attention")
    assert len(fuse["details"]["unfused"]) == 1 and "1 attention block(s) left unfused" in fuse["problems"][0]
    steps = []
    with pytest.raises(StrictModeError, match="1 of 1 left unfused"):
        build(path, BuildConfig(target="cpu", out=tmp_path / "b2", seq=(1, 8, 16), passes=passes, strict=True),
              progress=steps.append)
    assert not any(s.startswith("engine") for s in steps)


# --- real TorchScript exports -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torchscript_bert(tmp_path_factory):
    """opset -> a TorchScript export of a 2-layer BERT with random weights (eager attention)."""
    from edgeattn.export import ExportConfig, export_module
    from test_fusion_models import _tiny

    folder, cache = tmp_path_factory.mktemp("ts"), {}

    def get(opset: int):
        if opset not in cache:
            model, kind = _tiny("bert", "eager")
            model.config._attn_implementation = "eager"  # softmax(QK^T)V at every opset (SDPA needs 14)
            cache[opset] = export_module(model, kind, folder / f"bert-{opset}.onnx",
                                         ExportConfig(exporter="torchscript", opset=opset))
        return cache[opset]

    return get


@requires_torch
@pytest.mark.parametrize("opset", [13, 14, 15, 16, 17])
def test_torchscript_exports_are_upgraded_fused_and_match(torchscript_bert, tmp_path, opset):
    bundle = build(torchscript_bert(opset), BuildConfig(target="cpu", out=tmp_path / "b", seq=(1, 24, 64),
                                                        strict=True))
    upgrade = pass_details(bundle, "upgrade-opset")
    assert upgrade["changed"] and upgrade["details"] == {"from": opset, "to": 18}
    assert f"upgraded from opset {opset} to 18" in (bundle.path / "report.md").read_text()
    assert pass_details(bundle, "fuse-attention")["details"]["fused"] == 2
    assert pass_details(bundle, "fuse-gelu-cpu")["details"]["fused"] == 2
    parity = bundle.manifest.sections["parity"]
    assert parity["status"] == "pass" and parity["max_abs_diff"] <= 1e-4
    assert bundle.manifest.source["opset"] == opset  # the source is compared as it was given


@requires_torch
def test_cli_summary_line_gives_the_fused_counts(torchscript_bert, tmp_path, runner):
    from edgeattn.cli.main import cli

    result = runner.invoke(cli, ["build", str(torchscript_bert(17)), "--target", "cpu", "--seq", "1:24:64",
                                 "--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    assert "attention 2/2 blocks fused, GELU 2/2 fused, opset 17 -> 18" in result.output


@requires_torch
@requires_minilm
@pytest.mark.slow
def test_stock_minilm_torchscript_opset_17(tmp_path):
    """Issue 20: the stock TorchScript export of all-MiniLM-L6-v2 at opset 17 fuses 6/6 attention blocks
    and 6/6 GELUs, and matches the source."""
    from edgeattn.export import ExportConfig, export_hf

    src = export_hf("minilm", tmp_path / "minilm-ts17.onnx", ExportConfig(exporter="torchscript", opset=17))
    bundle = build(src, BuildConfig(target="cpu", out=tmp_path / "b", seq=(1, 32, 128), strict=True))
    assert pass_details(bundle, "fuse-attention")["details"]["fused"] == 6
    assert pass_details(bundle, "fuse-gelu-cpu")["details"]["fused"] == 6
    assert bundle.manifest.sections["problems"] == []
    assert bundle.manifest.sections["parity"]["max_abs_diff"] <= 1e-4
