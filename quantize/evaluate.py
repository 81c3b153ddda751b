"""Fidelity of a quantized ONNX model (and of PTQ with a config) against the float model."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

from edgeattn import hf_models, text
from edgeattn.errors import ConfigError
from edgeattn.quantize import fidelity as fid
from edgeattn.quantize.config import config_from_name


@dataclass(frozen=True)
class EvalJob:
    model: str
    onnx: Path
    text: Path | None = None
    ptq_config: str | None = None
    block_size: int | None = None
    calib: Path | None = None
    seq_len: int = 128

    def __post_init__(self) -> None:
        if self.seq_len < 8:
            raise ConfigError(f"seq_len: expected >= 8, found {self.seq_len}")


def fidelity(kind: str, reference, candidate, tokenizer, texts: list[str], seq_len: int) -> dict:
    """Encoders: cosine of sentence embeddings (mean, min); decoders: perplexity of both and the ratio."""
    if kind == "decoder":
        chunks = text.token_chunks(tokenizer, texts, seq_len)
        if chunks.shape[0] == 0:
            raise ConfigError(f"held-out text: expected at least {seq_len} tokens, found fewer")
        ref, cand = fid.perplexity(reference, chunks), fid.perplexity(candidate, chunks)
        return {"ppl_float": ref, "ppl": cand, "ppl_increase_pct": 100.0 * (cand / ref - 1.0)}
    batches = list(text.eval_batches(tokenizer, texts, 16, seq_len))
    c = fid.embedding_cosines(reference, candidate, batches)
    return {"cos_mean": float(c.mean()), "cos_min": float(c.min()), "n": int(c.size)}


def evaluate(job: EvalJob, progress=lambda m: None) -> list[dict]:
    from edgeattn.quantize.api import calibrate, quantize_  # loads torch

    config = config_from_name(job.ptq_config, block_size=job.block_size) if job.ptq_config else None
    model, tok, kind = hf_models.load(job.model)
    texts = text.read_lines(job.text) if job.text else text.heldout_texts(kind)
    reference = fid.torch_forward(model, kind)
    rows = [{"what": f"onnx {job.onnx.name}", **fidelity(kind, reference, fid.onnx_forward(job.onnx), tok, texts, job.seq_len)}]
    if config is not None:
        calib = text.read_texts(job.calib)
        ptq = copy.deepcopy(model)
        quantize_(ptq, config)
        calibrate(ptq, text.leading_batches(text.padded_examples(tok, calib, kind, 64), 16, 8))
        progress(f"PTQ {config.name}: calibrated")
        rows.append({"what": f"ptq {config.name}", **fidelity(kind, reference, fid.torch_forward(ptq, kind), tok, texts, job.seq_len)})
    return rows
