"""edgeattn quantize and edgeattn eval end to end on a tiny saved BERT."""

from __future__ import annotations

import onnx
import pytest

from edgeattn.cli.main import cli


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    from quant_models import save_tiny_bert

    return save_tiny_bert(tmp_path_factory.mktemp("bert"))


def test_quantize_then_eval(runner, tmp_path, bert_dir):
    calib = tmp_path / "calib.txt"
    calib.write_text("\n".join(" ".join(f"w{(i * 7 + j) % 60}" for j in range(10)) + " ." for i in range(40)))
    out = tmp_path / "bert.w4.onnx"
    r = runner.invoke(cli, ["quantize", "--model", str(bert_dir), "--config", "w4", "--block-size", "32",
                            "--calib", str(calib), "--steps", "2", "--batch-size", "4", "--seq-len", "16",
                            "--out", str(out)])
    assert r.exit_code == 0, r.output + (r.stderr or "")
    assert "12 quantized MatMuls" in r.stdout and "INT4 12 weights" in r.stdout
    model = onnx.load(str(out))
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in model.graph.output] == ["last_hidden_state"]

    r = runner.invoke(cli, ["eval", "--model", str(bert_dir), "--onnx", str(out), "--text", str(calib),
                            "--ptq", "w4", "--calib", str(calib), "--seq-len", "16"])
    assert r.exit_code == 0, r.output + (r.stderr or "")
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("what=")]
    assert len(rows) == 2 and "ptq w4" in rows[1]
    cos = [float(ln.split("cos_mean=")[1].split()[0]) for ln in rows]
    assert all(0.5 < c <= 1.0001 for c in cos)
