"""Distillation text from a causal LM: prompts, sampling, and the one-document-a-line file."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from edgeattn.errors import ConfigError  # noqa: E402
from edgeattn.quantize.generated_text import (GENRES, TOPICS, GenerateConfig, generate_documents, prompts,
                                              write_documents)  # noqa: E402
from edgeattn.text import read_texts  # noqa: E402
from tests.quant_models import tiny_llama  # noqa: E402


def word_tokenizer(vocab: int = 1024):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<unk>", "<eos>"] + [f"w{i}" for i in range(vocab - 3)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>",
                                                eos_token="<eos>")


def test_prompts_are_seeded_and_span_genres_and_topics():
    a, b = prompts(400, seed=3), prompts(400, seed=3)
    assert a == b and a != prompts(400, seed=4)
    assert len({p for p in a}) > 300  # genre x topic: 1200 combinations
    assert sum(any(g in p for p in a) for g in GENRES) == len(GENRES)
    assert sum(any(t in p for p in a) for t in TOPICS) > len(TOPICS) * 0.9


def test_generation_is_seeded_and_round_trips_through_the_text_file(tmp_path):
    model, tok = tiny_llama(), word_tokenizer()
    config = GenerateConfig(docs=5, max_new_tokens=6, batch=2, seed=1)
    docs = generate_documents(model, tok, config)
    assert len(docs) == 5 and all(0 < len(d.split()) <= 6 for d in docs)
    assert docs == generate_documents(model, tok, config)
    assert docs != generate_documents(model, tok, GenerateConfig(docs=5, max_new_tokens=6, batch=2, seed=2))
    assert tok.padding_side == "right"  # restored after the left-padded batches
    assert read_texts(write_documents(docs, tmp_path / "gen.txt")) == docs


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="temperature"):
        GenerateConfig(temperature=0)
    with pytest.raises(ConfigError, match="expected >= 1, found 0/"):
        GenerateConfig(docs=0)


def test_cli_writes_the_text_and_its_manifest(tmp_path, monkeypatch):
    """`edgeattn distill-text` on a tiny Llama folder (word tokenizer): file, manifest, encoder refused."""
    import json

    from click.testing import CliRunner

    from edgeattn.cli.main import cli
    from tests.quant_models import save_tiny_bert

    folder = tmp_path / "llama"
    tiny_llama().save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    out = tmp_path / "text.txt"
    res = CliRunner().invoke(cli, ["distill-text", "--model", str(folder), "--out", str(out), "--docs", "3",
                                   "--max-new-tokens", "5", "--batch", "2"])
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "text.txt.json").read_text())
    assert manifest["documents"] == 3 == len(read_texts(out)) and manifest["config"]["max_new_tokens"] == 5
    res = CliRunner().invoke(cli, ["distill-text", "--model", str(save_tiny_bert(tmp_path / "bert")),
                                   "--out", str(tmp_path / "x.txt")])
    assert res.exit_code != 0 and "expected a causal language model" in res.output
    assert not (tmp_path / "x.txt").exists()
