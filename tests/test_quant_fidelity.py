"""Every lossy stage measures itself against the float model on held-out text, records it, and fails below a
floor (FidelityError, nothing written); the commands say when a result is far from a full run."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from edgeattn import text
from edgeattn.cli.main import cli
from edgeattn.errors import ConfigError, FidelityError
from edgeattn.quantize import fidelity as fid
from edgeattn.quantize.config import W8A8Config
from edgeattn.quantize.pipeline import QuantizeJob, run_quantize
from onnx_fixtures import has
from quant_models import save_tiny_bert, tiny_llama

pytestmark = pytest.mark.skipif(not has("gensim"), reason="needs gensim (held-out text)")
CALIB = "\n".join(" ".join(f"w{(i * 7 + j) % 60}" for j in range(10)) + " ." for i in range(40))


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("bert"))


def _job(bert_dir, out, **kw):
    return QuantizeJob(str(bert_dir), W8A8Config(), out, texts=tuple(CALIB.splitlines()), steps=2, batch_size=4,
                       seq_len=16, **kw)


def test_quantize_records_the_cosine_on_held_out_sentences(bert_dir, tmp_path):
    out = tmp_path / "q.onnx"
    result = run_quantize(_job(bert_dir, out, min_cosine=-1.0))
    got = result.section["fidelity"]
    sentences = text.polarity_sentences()[:64]
    batches = list(text.eval_batches(result.tokenizer, sentences, 16, 128))
    want = fid.embedding_cosines(fid.torch_forward(result.teacher, "encoder"),
                                 fid.torch_forward(result.model, "encoder"), batches)
    assert got["n"] == 64 and "pang_lee_polarity" in got["text"]
    assert got["cos_mean"] == pytest.approx(float(want.mean()), abs=1e-6)
    assert got["cos_min"] == pytest.approx(float(want.min()), abs=1e-6)
    assert got["cos_mean"] < 1.0 and out.is_file()  # quantization changed something; the floor passed


def test_a_floor_fails_the_stage_before_anything_is_written(bert_dir, tmp_path, runner):
    out = tmp_path / "q.onnx"
    floor = r"expected a mean embedding cosine >= 1.0 \(--min-cosine\), found 0\.\d+ on 64 sentences"
    with pytest.raises(FidelityError, match=floor):
        run_quantize(_job(bert_dir, out, min_cosine=1.0))
    assert not out.exists()
    with pytest.raises(ConfigError, match="max_ppl_increase: expected a decoder"):
        run_quantize(_job(bert_dir, out, max_ppl_increase=5.0))
    with pytest.raises(ConfigError, match="min_cosine: expected -1 <= cosine <= 1, found 1.5"):
        _job(bert_dir, out, min_cosine=1.5)
    calib = tmp_path / "calib.txt"
    calib.write_text(CALIB)
    r = runner.invoke(cli, ["quantize", "--model", str(bert_dir), "--config", "w8a8", "--calib", str(calib),
                            "--steps", "1", "--batch-size", "4", "--seq-len", "16", "--min-cosine", "1.0",
                            "--out", str(out)])
    assert r.exit_code == 7 and "expected a mean embedding cosine >= 1.0" in r.stderr, r.output
    assert not out.exists()


@pytest.mark.torch
def test_sparsify_records_fidelity_and_fails_below_the_floor(bert_dir, tmp_path, runner):
    out = tmp_path / "s.onnx"
    r = runner.invoke(cli, ["sparsify", "--model", str(bert_dir), "--method", "magnitude", "--out", str(out)])
    assert r.exit_code == 0, r.output
    section = json.loads((tmp_path / "s.onnx.sparsity.json").read_text())
    measured = section["fidelity"]
    assert measured["n"] == 64 and -1.0 <= measured["cos_min"] <= measured["cos_mean"] < 1.0
    assert f"fidelity: embedding cosine to the float model: mean {measured['cos_mean']:.7g}" in r.stderr
    assert ("far from what a longer run gives" in r.stdout) == (measured["cos_mean"] < 0.95)
    bad = tmp_path / "bad.onnx"
    r = runner.invoke(cli, ["sparsify", "--model", str(bert_dir), "--method", "magnitude", "--min-cosine", "0.99999",
                            "--out", str(bad)])
    assert r.exit_code == 7 and "sparsify: expected a mean embedding cosine >= 0.99999" in r.stderr, r.output
    assert not bad.exists() and not (tmp_path / "bad.onnx.sparsity.json").exists()


def test_decoder_probe_measures_the_perplexity_increase(bert_dir):
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(bert_dir))  # word-level: ids below the model's vocab
    docs = [" ".join(f"w{(i * 13 + j * 7) % 60}" for j in range(300)) for i in range(3)]
    model = tiny_llama(0)
    probe = fid.Probe.measure(model, tok, "decoder", texts=docs)
    noisy = copy.deepcopy(model)
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(0.02 * torch.randn_like(p))
    got = probe.compare(noisy)
    chunks = text.token_chunks(tok, docs, fid.HELDOUT_SEQ, max_chunks=fid.HELDOUT_CHUNKS)
    assert chunks.shape[0] == fid.HELDOUT_CHUNKS
    ref = fid.perplexity(fid.torch_forward(model, "decoder"), chunks)
    cand = fid.perplexity(fid.torch_forward(noisy, "decoder"), chunks)
    assert got["ppl_float"] == pytest.approx(ref) and got["ppl"] == pytest.approx(cand)
    assert got["ppl_increase_pct"] == pytest.approx(100 * (cand / ref - 1))
    fid.check_floor(got, "sparsify", None, got["ppl_increase_pct"] + 0.1)
    with pytest.raises(FidelityError, match="expected a perplexity increase <= "):
        fid.check_floor(got, "sparsify", None, got["ppl_increase_pct"] - 0.1)


def test_the_warning_says_when_a_result_is_far_from_a_full_run():
    low = {"metric": "cosine", "cos_mean": 0.79, "cos_min": 0.5, "n": 64, "text": "64 sentences"}
    warning = fid.far_warning(low, "sparsify", "0 fine-tuning steps")
    assert "mean 0.79," in warning and "0.97" in warning and "this run: 0 fine-tuning steps" in warning
    assert fid.far_warning({**low, "cos_mean": 0.971}, "sparsify", "6000 fine-tuning steps") is None
    ppl = {"metric": "perplexity", "ppl": 60.0, "ppl_float": 38.0, "ppl_increase_pct": 57.9, "text": "4 chunks"}
    assert "+57.9%" in fid.far_warning(ppl, "sparsify", "100 fine-tuning steps")
    assert "+21%" in fid.far_warning(ppl, "sparsify", "100 fine-tuning steps")
    assert fid.far_warning({**ppl, "ppl_increase_pct": 1.1}, "quantize", "600 QAT steps") is None
