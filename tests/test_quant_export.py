"""Q/DQ export of tiny BERT / Llama models: graph structure, ONNX Runtime vs the torch fake-quant model,
the cpu lowering pass, and TensorRT for RTX parse + build (CPU-only, one build per subprocess)."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper

from edgeattn.quantize import FP8Config, W4Config, W8A8Config, calibrate, distill, DistillConfig, export_qdq, quantize_
from edgeattn.text import sampled_batches
from onnx_fixtures import has
from quant_models import tiny_bert, tiny_llama, token_batch

CASES = {"bert-w8a8": (tiny_bert, "encoder", W8A8Config()), "bert-w4": (tiny_bert, "encoder", W4Config(block_size=32)),
         "llama-w8a8": (tiny_llama, "decoder", W8A8Config()), "bert-fp8": (tiny_bert, "encoder", FP8Config())}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """case -> (onnx path, torch fake-quant model, kind), trained for 2 QAT steps so scales moved."""
    folder = tmp_path_factory.mktemp("qdq")
    out = {}
    for name, (make, kind, config) in CASES.items():
        model = make()
        teacher = copy.deepcopy(model)
        quantize_(model, config)
        calibrate(model, [token_batch(8, 12, seed=1)])
        distill(model, teacher, sampled_batches(token_batch(16, 12, seed=2), 8), kind,
                DistillConfig(steps=2, progress=False, lr=1e-3, scale_lr=1e-2))
        path = folder / f"{name}.onnx"
        export_qdq(model, kind, path)
        out[name] = (path, model, kind)
    return out


def _inits(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: i for i in model.graph.initializer}


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in model.graph.node for o in n.output}


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _quantized_matmuls(model):
    prod = _producers(model)
    return [(n, prod.get(n.input[0]), prod.get(n.input[1])) for n in model.graph.node
            if n.op_type == "MatMul" and n.input[1] in prod and prod[n.input[1]].op_type == "DequantizeLinear"]


@pytest.mark.parametrize("name,n_linear", [("bert-w8a8", 12), ("llama-w8a8", 15)])
def test_w8a8_structure(exported, name, n_linear):
    model = onnx.load(str(exported[name][0]))
    inits, prod = _inits(model), _producers(model)
    mms = _quantized_matmuls(model)
    assert len(mms) == n_linear  # every Linear (BERT: q k v o up down x 2; Llama: + gate, lm_head)
    for mm, act, wdq in mms:
        w = inits[wdq.input[0]]
        assert w.data_type == onnx.TensorProto.INT8 and len(w.dims) == 2
        assert _attr(wdq, "axis") == 1 and list(inits[wdq.input[1]].dims) == [w.dims[1]]  # per output channel
        assert act.op_type == "DequantizeLinear" and prod[act.input[0]].op_type == "QuantizeLinear"
        q = prod[act.input[0]]
        assert q.input[1] == act.input[1] and list(inits[q.input[1]].dims) == []  # one per-tensor scale
        for node in (wdq, act, q):
            zp = numpy_helper.to_array(inits[node.input[2]])
            assert zp.dtype == np.int8 and not zp.any()
        assert all(numpy_helper.to_array(inits[s]).min() > 0 for s in (wdq.input[1], q.input[1]))
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask"]
    assert model.graph.output[0].name == ("logits" if "llama" in name else "last_hidden_state")


def test_w4_structure_is_opset21_block_dq(exported):
    model = onnx.load(str(exported["bert-w4"][0]))
    assert {o.domain: o.version for o in model.opset_import}[""] == 21
    inits = _inits(model)
    mms = _quantized_matmuls(model)
    assert len(mms) == 12
    for mm, act, wdq in mms:
        w, s = inits[wdq.input[0]], inits[wdq.input[1]]
        assert w.data_type == onnx.TensorProto.INT4
        assert _attr(wdq, "axis") == 0 and _attr(wdq, "block_size") == 32
        assert list(s.dims) == [w.dims[0] // 32, w.dims[1]]
        assert act is None or act.op_type != "DequantizeLinear"  # weight-only
        assert not numpy_helper.to_array(inits[wdq.input[2]]).astype(np.int8).any()


def test_fp8_structure(exported):
    model = onnx.load(str(exported["bert-fp8"][0]))
    inits = _inits(model)
    for mm, act, wdq in _quantized_matmuls(model):
        assert inits[wdq.input[0]].data_type == onnx.TensorProto.FLOAT8E4M3FN
        assert act.op_type == "DequantizeLinear"


def _ort(path, optimize=False):
    so = ort.SessionOptions()
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("name", list(CASES))
def test_onnx_runtime_matches_the_torch_fake_quant_model(exported, name):
    path, model, kind = exported[name]
    batch = token_batch(3, 10, seed=5)
    batch["attention_mask"][1, 7:] = 0
    got = _ort(path).run(None, {k: v.numpy() for k, v in batch.items()})[0]
    with torch.no_grad():
        out = model(**batch)
    want = (out.logits if kind == "decoder" else out.last_hidden_state).numpy()
    # the same rounding on both sides; only float summation order differs
    np.testing.assert_allclose(got, want, atol=2e-4 * np.abs(want).max())


def test_cpu_build_lowers_int8_matmuls_and_keeps_the_result(exported, tmp_path):
    from edgeattn.bundle.build import BuildConfig, build

    path, model, kind = exported["bert-w8a8"]
    bundle = build(path, BuildConfig(target="cpu", out=tmp_path / "b.edgeattn", batch=(1, 2, 4), seq=(1, 8, 16)))
    parity = bundle.manifest.sections["parity"]  # the default bound for a quantized graph is relative
    assert parity["status"] == "pass" and "quantized graph" in parity["tolerance_basis"]
    assert parity["tolerance"] == pytest.approx(0.05)  # relative: of the reference outputs' magnitude
    passes = {p["name"]: p for p in bundle.manifest.sections["passes"]}
    details = passes["lower-qdq-cpu"]["details"]
    assert details["lowered"] == 12 and not passes["lower-qdq-cpu"]["problems"]
    assert details["activation_quantizations"] == 8 and details["merged"] == 4  # q/k/v share one GEMM per layer
    ops = bundle.manifest.sections["engine"]["op_counts"]
    assert ops.get("MatMulIntegerToFloat", 0) == 8 and "DequantizeLinear" not in ops
    batch = {k: v.numpy() for k, v in token_batch(2, 10, seed=6).items()}
    want = _ort(path).run(None, batch)[0]
    sess = _ort(bundle.path / bundle.manifest.artifact, optimize=True)
    if any(i.name == "attention_window" for i in sess.get_inputs()):  # the build fused the attention
        batch["attention_window"] = np.array(0, dtype=np.int64)  # 0: full attention, as in the source
    got = sess.run(None, batch)[0]
    assert np.abs(got - want).max() < 0.02 * np.abs(want).max()


def test_lowering_pass_leaves_non_cpu_targets_alone(exported):
    import onnx_ir as ir

    from edgeattn.passes import PassContext
    from edgeattn.passes.plans import plan_for
    from edgeattn.passes.qdq_cpu import LowerQdqMatMulForCpu
    from edgeattn.targets import get_target

    model = ir.load(str(exported["bert-w8a8"][0]))
    plan = plan_for(get_target("rtx").backend)  # TensorRT builds the Q/DQ graph itself: not in its plan
    results = plan.only(tuple(n for n in plan.passes if n == LowerQdqMatMulForCpu.name)).run(model, PassContext(get_target("rtx")))
    assert not any(r.changed for r in results) and LowerQdqMatMulForCpu.name not in plan.passes


@pytest.mark.rtx
@pytest.mark.skipif(not has("tensorrt_rtx"), reason="needs tensorrt-rtx")
@pytest.mark.parametrize("name", ["bert-w8a8", "bert-w4", "llama-w8a8"])
def test_tensorrt_rtx_parses_and_builds_the_export(exported, name):
    script = Path(__file__).parent / "rtx_build_check.py"
    r = subprocess.run([sys.executable, str(script), str(exported[name][0])], capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0 and "built" in r.stdout, r.stdout + r.stderr[-2000:]
