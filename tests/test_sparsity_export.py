"""sparsify_ -> export: the exported ONNX holds the masked weights, the graph check finds every pruned layer."""

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from onnx_fixtures import has, requires_torch

pytestmark = [requires_torch, pytest.mark.torch, pytest.mark.slow,
              pytest.mark.skipif(not has("transformers"), reason="needs transformers")]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    import torch
    import transformers

    from edgeattn.quantize.sparsity.masks import SparsityConfig, sparsify_
    from edgeattn.quantize.sparsity.pipeline import export_masked

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64)
    model = transformers.BertModel(config, add_pooling_layer=False).eval()
    report = sparsify_(model, SparsityConfig())
    out = tmp_path_factory.mktemp("sparse") / "bert.onnx"
    export_masked(model, "encoder", out, report.pruned, {})
    return model, report, out


def test_every_pruned_layer_is_sparse_in_the_exported_graph(exported):
    from edgeattn.passes.check_sparsity import check_model

    model, report, out = exported
    assert len(report.pruned) == 6  # q, k, v, attention output, intermediate, output
    layers = check_model(ir.serde.deserialize_model(onnx.load(str(out))))
    sparse = {e.layer for e in layers if e.sparse}
    assert sparse == set(report.pruned)
    assert not [e for e in layers if e.status == "broken"]


def test_exported_model_matches_the_masked_torch_model(exported):
    import torch

    model, _, out = exported
    ids = torch.randint(0, 100, (2, 9))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
    got = ort.InferenceSession(str(out)).run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
    assert np.abs(got - want).max() < 1e-4


def test_check_names_the_layer_of_a_weight_broken_on_purpose(exported, tmp_path, runner):
    from edgeattn.cli.main import cli
    from edgeattn.passes.check_sparsity import check_model

    _, report, out = exported
    model = onnx.load(str(out))
    layers = check_model(ir.serde.deserialize_model(model))
    victim = next(e for e in layers if e.layer.endswith("intermediate.dense"))
    init = next(i for i in model.graph.initializer if i.name == victim.weight)
    w = numpy_helper.to_array(init).copy()
    zeros = np.argwhere(np.moveaxis(w, victim.axis, -1) == 0)[0]
    w_moved = np.moveaxis(w, victim.axis, -1)
    w_moved[tuple(zeros)] = 0.123
    init.CopyFrom(numpy_helper.from_array(np.moveaxis(w_moved, -1, victim.axis).copy(), init.name))
    broken = tmp_path / "broken.onnx"
    onnx.save(model, str(broken))
    result = runner.invoke(cli, ["check-sparsity", str(broken)])
    assert result.exit_code == 2
    assert victim.layer in result.output and "marked sparse by edgeattn sparsify" in result.output
