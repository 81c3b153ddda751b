"""Text for calibration, QAT and held-out checks: files with one text a line, gensim's corpora."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from edgeattn.errors import InputError


def read_lines(path: str | Path, encoding: str = "utf-8") -> list[str]:
    """Non-empty lines of a text file; an empty file is an error."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"text file {path}: expected a file with one text a line, found nothing there")
    lines = [ln.strip() for ln in path.read_text(encoding=encoding, errors="replace").splitlines()]
    lines = [ln for ln in lines if ln]
    if not lines:
        raise InputError(f"text file {path}: expected one text a line, found no text")
    return lines


def _gensim_file(name: str) -> Path:
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise InputError("the gensim corpora need gensim: pip install gensim")
    return Path(next(iter(spec.submodule_search_locations))) / "test" / "test_data" / name


def lee_documents() -> list[str]:
    """The 300 Lee news documents (calibration / training text)."""
    return read_lines(_gensim_file("lee_background.cor"), encoding="latin-1")


def polarity_sentences() -> list[str]:
    """The 200 labelled movie-review sentences, labels stripped (held-out: never train on them)."""
    lines = read_lines(_gensim_file("pang_lee_polarity.cor"), encoding="cp1252")
    return [re.sub(r"^__label__\S+\s*", "", ln) for ln in lines]


def sentences(documents: list[str], min_words: int = 4) -> list[str]:
    """Split documents into sentences (for sentence-embedding models)."""
    out = []
    for doc in documents:
        out += [s.strip() for s in re.split(r"(?<=[.!?])\s+", doc) if len(s.split()) >= min_words]
    return out


def batches(tokenizer, texts: list[str], batch_size: int, max_length: int):
    """Tokenized batches (input_ids, attention_mask) in order; the last one may be short."""
    for i in range(0, len(texts), batch_size):
        enc = tokenizer(texts[i:i + batch_size], padding=True, truncation=True, max_length=max_length,
                        return_tensors="pt")
        yield {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
