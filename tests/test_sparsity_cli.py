"""edgeattn sparsify end to end on a tiny BERT folder: prune (calibrated), fine-tune, export, check."""

import json
import shutil

import pytest

from onnx_fixtures import has, requires_minilm, requires_torch

pytestmark = [requires_torch, requires_minilm, pytest.mark.torch, pytest.mark.slow,
              pytest.mark.skipif(not has("gensim"), reason="needs gensim (calibration text)")]


@pytest.fixture(scope="module")
def tiny_bert_dir(tmp_path_factory):
    import torch
    import transformers

    from edgeattn import hf_models

    torch.manual_seed(0)
    src = hf_models.resolve("minilm")
    out = tmp_path_factory.mktemp("tinybert")
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=128)
    transformers.BertModel(config).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (src / name).is_file():
            shutil.copy(src / name, out / name)
    return out


def test_sparsify_then_check(tiny_bert_dir, tmp_path, runner):
    from edgeattn.cli.main import cli

    out = tmp_path / "tiny24.onnx"
    result = runner.invoke(cli, ["sparsify", "--model", str(tiny_bert_dir), "--out", str(out),
                                 "--finetune-steps", "2", "--batch", "4", "--permute"])
    assert result.exit_code == 0, result.output
    section = json.loads((tmp_path / "tiny24.onnx.sparsity.json").read_text())
    pruned = section["sparsity"]["pruned"]
    assert len(pruned) == 7  # q, k, v, attention output, intermediate, output, pooler
    assert section["finetune"]["loss_last"] is not None
    ffn = next(d for d in section["sparsity"]["layers"] if d["name"].endswith("layer.0.output.dense"))
    assert ffn["permutation_applied"] and ffn["kept_magnitude_permuted"] >= ffn["kept_magnitude"]
    result = runner.invoke(cli, ["check-sparsity", str(out), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data["sparse_layers"]) == set(pruned) - {"pooler.dense"}  # the pooler is not in the graph


def test_sparsify_then_w8a8_qat_keeps_the_zeros_behind_dequantize(tiny_bert_dir, tmp_path, runner):
    import onnx

    from edgeattn.cli.main import cli

    out = tmp_path / "tiny24q.onnx"
    result = runner.invoke(cli, ["sparsify", "--model", str(tiny_bert_dir), "--out", str(out), "--method", "magnitude",
                                 "--qat", "w8a8", "--qat-steps", "2", "--batch", "4"])
    assert result.exit_code == 0, result.output
    section = json.loads((tmp_path / "tiny24q.onnx.sparsity.json").read_text())
    assert section["qat"]["masks_kept"] is True
    ops = [n.op_type for n in onnx.load(str(out)).graph.node]
    assert ops.count("DequantizeLinear") >= 6
    result = runner.invoke(cli, ["check-sparsity", str(out), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    behind_dq = [e for e in data["layers"] if e["sparse"] and "DequantizeLinear" in e["reason"]]
    assert {e["layer"] for e in behind_dq} == set(section["sparsity"]["pruned"]) - {"pooler.dense"}


def test_sparsify_sequential_and_device_checks(tiny_bert_dir, tmp_path, runner):
    """--method sequential end to end (manifest says so); --device is validated, and cuda without a GPU
    fails with a clear message and writes nothing."""
    import torch

    from edgeattn.cli.main import cli
    from edgeattn.errors import ConfigError
    from edgeattn.quantize.sparsity.pipeline import SparsifyJob

    out = tmp_path / "seq.onnx"
    result = runner.invoke(cli, ["sparsify", "--model", str(tiny_bert_dir), "--out", str(out), "--method",
                                 "sequential", "--calib-batches", "2", "--finetune-steps", "1", "--batch", "2",
                                 "--seq-len", "24"])
    assert result.exit_code == 0, result.output
    section = json.loads((tmp_path / "seq.onnx.sparsity.json").read_text())
    assert section["sparsity"]["config"]["method"] == "sequential" and section["job"]["device"] == "cpu"
    assert section["finetune"]["config"]["seq_len"] == 24
    assert section["sparsity"]["pruned"]
    with pytest.raises(ConfigError, match="expected cpu, cuda or cuda:N, found 'gpu'"):
        SparsifyJob(device="gpu")  # validated before any model is loaded
    if not torch.cuda.is_available():
        result = runner.invoke(cli, ["sparsify", "--model", str(tiny_bert_dir), "--out", str(tmp_path / "g.onnx"),
                                     "--device", "cuda"])
        assert result.exit_code != 0 and "expected a CUDA device, found none" in result.output
        assert not (tmp_path / "g.onnx").exists()
