"""Build plans: a named list of passes per backend, run on onnx-ir's pass infrastructure."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest

from edgeattn.bundle.build import BuildConfig, build
from edgeattn.errors import BuildError, ConfigError, InputError
from edgeattn.passes import PassContext, PassResult, plans, registry
from edgeattn.targets import get_target


class CountNodes:
    """A pass from outside the package: changes nothing, says how many nodes it saw."""

    name = "count-nodes"

    def __call__(self, model: ir.Model, ctx: PassContext) -> PassResult:
        return PassResult(self.name, False, f"{len(list(model.graph))} nodes", {"nodes": len(list(model.graph))})


class Explode:
    name = "explode"

    def __call__(self, model, ctx):
        raise RuntimeError("boom")


class Refuse:
    name = "refuse"

    def __call__(self, model, ctx):
        raise InputError("the user's model is wrong: expected this, found that")


def _with(monkeypatch, name, factory, after):
    monkeypatch.setitem(registry.PASSES, name, factory)
    monkeypatch.setitem(plans.PLANS, "onnxruntime", plans.CPU.with_pass(name, after=after))


def test_a_pass_registered_in_a_plan_runs_without_touching_the_build(tiny_onnx, monkeypatch):
    _with(monkeypatch, "count-nodes", CountNodes, after="cleanup")
    lines = []
    bundle = build(tiny_onnx, BuildConfig(target="cpu"), progress=lines.append)
    names = [p["name"] for p in bundle.manifest.sections["passes"]]
    assert names[names.index("cleanup") + 1] == "count-nodes"
    counted = next(p for p in bundle.manifest.sections["passes"] if p["name"] == "count-nodes")
    assert counted["details"]["nodes"] > 0 and counted["seconds"] >= 0
    assert any(line.startswith("pass count-nodes: unchanged in ") for line in lines)
    assert bundle.manifest.build_config["plan"] == "cpu" and "count-nodes" in bundle.manifest.build_config["passes"]


def test_a_failing_pass_is_named_with_the_passes_before_it(tiny_onnx, monkeypatch):
    _with(monkeypatch, "explode", Explode, after="fuse-attention")
    with pytest.raises(BuildError, match=r"graph pass 'explode' of the cpu plan failed \(boom\); passes before it: "
                                         r"inference-mode, upgrade-opset, fuse-attention$"):
        build(tiny_onnx, BuildConfig(target="cpu"))
    assert not tiny_onnx.with_name("tiny.edgeattn").exists()


def test_a_pass_that_blames_the_input_stops_the_build_with_that_error(tiny_onnx, monkeypatch):
    _with(monkeypatch, "refuse", Refuse, after="inference-mode")
    with pytest.raises(InputError, match="the user's model is wrong"):
        build(tiny_onnx, BuildConfig(target="cpu"))


def test_each_backend_has_its_plan_and_no_pass_skips_itself():
    cpu, trt = plans.plan_for("onnxruntime"), plans.plan_for("tensorrt_rtx")
    assert plans.plan_for("tensorrt") is trt and trt.name == "tensorrt" and cpu.name == "cpu"
    assert not [p for p in trt.passes if p.endswith("-cpu") or p == "logits-to-keep"]
    assert set(trt.passes) < set(cpu.passes) and plans.FAST_PATH.passes == cpu.passes
    with pytest.raises(ConfigError, match="no build plan for backend"):
        plans.plan_for("nothing")


def test_a_plan_that_breaks_an_order_rule_cannot_be_made():
    with pytest.raises(ConfigError, match="expected fuse-rotary-cpu before lower-cached-cpu"):
        plans.BuildPlan("bad", ("lower-cached-cpu", "fuse-rotary-cpu"))
    with pytest.raises(ConfigError, match="unknown graph pass"):
        plans.BuildPlan("bad", ("no-such-pass",))
    with pytest.raises(ConfigError, match="expected passes of the tensorrt plan"):
        plans.TENSORRT.only(("fuse-gelu-cpu",))


def test_registering_a_taken_name_is_refused():
    with pytest.raises(ConfigError, match="already registered"):
        registry.register("cleanup", CountNodes)


def test_the_model_file_is_read_once_and_the_builder_gets_the_ir(tiny_onnx, monkeypatch):
    import edgeattn.engines.onnxruntime as ort_builder

    reads, jobs = [], []
    real_load, real_build = onnx.load, ort_builder.build_artifact
    monkeypatch.setattr(onnx, "load", lambda f, *a, **k: (reads.append(str(f)), real_load(f, *a, **k))[1])
    monkeypatch.setattr(ort_builder, "build_artifact", lambda job: (jobs.append(job), real_build(job))[1])
    build(tiny_onnx, BuildConfig(target="cpu"))
    assert reads.count(str(tiny_onnx)) == 1
    (job,) = jobs
    assert isinstance(job.model, ir.Model) and [s.name for s in job.signature.inputs] == \
        [i.name for i in job.model.graph.inputs if not i.is_initializer()]
    assert job.model_path.name == "model.onnx"


def test_a_pass_runs_alone_with_a_typed_context():
    model = ir.serde.deserialize_model(onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])]),
        opset_imports=[onnx.helper.make_opsetid("", 18)]))
    results = plans.BuildPlan("one", ("cleanup",)).run(model, PassContext(get_target("cpu"), seq=(1, 8, 16)))
    assert [r.name for r in results] == ["cleanup"]
    with pytest.raises(ConfigError, match="cached_attention"):
        PassContext(get_target("cpu"), cached_attention="linear")
