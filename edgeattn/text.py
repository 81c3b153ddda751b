"""Text for every stage: read it, split it into sentences, cut it into token chunks, batch it.

Calibration, QAT, 2:4 fine-tuning, the fidelity checks and the thermal window -> quality table all take
their text from here (it sits below edgeattn.quantize and edgeattn.runtime, so both may import it). The
default corpora ship with gensim (nothing is downloaded):

* lee_background.cor: 300 news documents, the default training / calibration text;
* lee.cor: 50 other news documents, held out (never in the default training text): decoder checks;
* pang_lee_polarity.cor: 200 movie-review sentences, held out: encoder checks.

torch is imported inside the functions that build tensors, so importing this module stays light.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Iterator

from edgeattn.errors import InputError

SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


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
        raise InputError("the default text comes from gensim's corpora: pip install 'edgeattn[models]'")
    return Path(next(iter(spec.submodule_search_locations))) / "test" / "test_data" / name


def lee_documents() -> list[str]:
    """The 300 lee_background news documents: the default training and calibration text."""
    return read_lines(_gensim_file("lee_background.cor"), encoding="latin-1")


def lee_heldout_documents() -> list[str]:
    """The 50 lee.cor news documents: held out (never in the default training text)."""
    return read_lines(_gensim_file("lee.cor"), encoding="latin-1")


def polarity_sentences() -> list[str]:
    """The 200 labelled movie-review sentences, labels stripped (held out: never train on them)."""
    lines = read_lines(_gensim_file("pang_lee_polarity.cor"), encoding="cp1252")
    return [re.sub(r"^__label__\S+\s*", "", ln) for ln in lines]


def read_texts(path: str | Path | None = None) -> list[str]:
    """Documents, one a line: from `path`, or the lee_background corpus."""
    return lee_documents() if path is None else read_lines(path)


def heldout_texts(kind: str) -> list[str]:
    """Default held-out text: polarity sentences (encoders), lee.cor documents (decoders)."""
    return lee_heldout_documents() if kind == "decoder" else polarity_sentences()


def sentences(documents: list[str], min_words: int = 3) -> list[str]:
    """Split documents at . ! ? followed by white space; sentences of at least `min_words` words, each
    ending in a full stop when it had no end mark (for sentence-embedding models)."""
    out = []
    for doc in documents:
        for s in SENTENCE_END.split(doc):
            s = s.strip()
            if len(s.split()) >= min_words:
                out.append(s if s[-1] in ".!?" else s + ".")
    return out


# -- tokens ----------------------------------------------------------------------------------------

def token_stream(tokenizer, texts: list[str]) -> list[int]:
    """The texts' tokens one after the other, EOS between them (when the tokenizer has one)."""
    eos = tokenizer.eos_token_id
    stream: list[int] = []
    for t in texts:
        stream += tokenizer(t, add_special_tokens=False)["input_ids"] + ([eos] if eos is not None else [])
    return stream


def token_chunks(tokenizer, texts: list[str], seq_len: int, max_chunks: int | None = None):
    """The token stream cut into consecutive [N, seq_len] chunks (int64 tensor)."""
    import torch

    stream = token_stream(tokenizer, texts)
    n = len(stream) // seq_len
    if max_chunks is not None:
        n = min(n, max_chunks)
    return torch.tensor(stream[:n * seq_len], dtype=torch.long).reshape(n, seq_len)


# -- batches ---------------------------------------------------------------------------------------

def eval_batches(tokenizer, texts: list[str], batch_size: int, max_length: int) -> Iterator[dict]:
    """Tokenized batches (input_ids, attention_mask) in order, padded per batch; the last may be short."""
    for i in range(0, len(texts), batch_size):
        enc = tokenizer(texts[i:i + batch_size], padding=True, truncation=True, max_length=max_length,
                        return_tensors="pt")
        yield {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def padded_examples(tokenizer, texts: list[str], kind: str, seq_len: int) -> dict:
    """Equal-length examples [N, seq_len]: sentences padded to seq_len (encoders), token chunks (decoders)."""
    import torch

    if kind == "decoder":
        ids = token_chunks(tokenizer, texts, seq_len)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    enc = tokenizer(sentences(texts) or texts, padding="max_length", truncation=True, max_length=seq_len,
                    return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def leading_batches(examples: dict, batch_size: int, count: int) -> list[dict]:
    """The first `count` batches of equal-length examples, in order (calibration)."""
    n = examples["input_ids"].shape[0]
    return [{k: v[i:i + batch_size] for k, v in examples.items()}
            for i in range(0, min(n, count * batch_size), batch_size)]


def sampled_batches(examples: dict, batch_size: int, seed: int = 0) -> Iterator[dict]:
    """Endless batches of `batch_size` examples drawn without replacement, batch `step` from a generator
    seeded by (seed, step): the same on every process, so data-parallel ranks can slice one global batch."""
    import torch

    n = examples["input_ids"].shape[0]
    if n < batch_size:
        raise InputError(f"distillation: expected at least batch_size={batch_size} training sequences, found {n}")

    def draw():
        step = 0
        while True:
            g = torch.Generator().manual_seed(seed * 1_000_003 + step)
            idx = torch.randperm(n, generator=g)[:batch_size]
            yield {k: v[idx] for k, v in examples.items()}
            step += 1

    return draw()


def stream_batches(tokenizer, texts: list[str], kind: str, *, batch_size: int = 16, seq_len: int = 128,
                   seed: int = 0, length_grouping: int = 16) -> Iterator[dict]:
    """Endless random batches: token windows of seq_len at random offsets of the token stream (decoders),
    or sentences up to seq_len tokens, padded per batch (encoders). With `length_grouping` > 1 an encoder
    pool of that many batches is drawn, sorted by length and cut, and its batches served in random order:
    far less padding (random batches of generated sentences were four fifths padding)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    if kind == "decoder":
        ids = torch.tensor(token_stream(tokenizer, texts))
        if len(ids) <= seq_len:
            raise InputError(f"training text: expected more than {seq_len} tokens, found {len(ids)}")

        def windows():
            while True:
                starts = torch.randint(0, len(ids) - seq_len, (batch_size,), generator=gen)
                x = torch.stack([ids[s:s + seq_len] for s in starts.tolist()])  # x: [B, S]
                yield {"input_ids": x, "attention_mask": torch.ones_like(x)}

        return windows()
    rows = tokenizer(sentences(texts), truncation=True, max_length=seq_len)["input_ids"]  # tokenized once
    if not rows:
        raise InputError("training text: expected sentences of at least 3 words, found none")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    with_types = "token_type_ids" in tokenizer.model_input_names

    def grouped():
        while True:
            pick = torch.randint(0, len(rows), (batch_size * length_grouping,), generator=gen).tolist()
            if length_grouping == 1:
                yield _padded([rows[i] for i in pick], pad, with_types)
                continue
            pick.sort(key=lambda i: len(rows[i]))
            for g in torch.randperm(length_grouping, generator=gen).tolist():
                yield _padded([rows[i] for i in pick[g * batch_size:(g + 1) * batch_size]], pad, with_types)

    return grouped()


def _padded(rows: list[list[int]], pad: int, with_types: bool) -> dict:
    """Token rows right-padded to the longest: input_ids, attention_mask (and token_type_ids)."""
    import torch

    x = torch.full((len(rows), max(len(r) for r in rows)), pad, dtype=torch.long)  # x: [B, S]
    mask = torch.zeros_like(x)
    for j, r in enumerate(rows):
        x[j, :len(r)] = torch.tensor(r)
        mask[j, :len(r)] = 1
    batch = {"input_ids": x, "attention_mask": mask}
    if with_types:
        batch["token_type_ids"] = torch.zeros_like(x)
    return batch
