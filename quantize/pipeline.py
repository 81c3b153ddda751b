"""The whole QAT job: Hugging Face model + text -> calibrated, distilled, Q/DQ ONNX (and fidelity).

Every input is checked before any training starts: config, block size against every Linear,
calibration text, model folder and weights."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from edgeattn.errors import ConfigError
from edgeattn.quantize.config import QuantConfig, config_to_dict

Progress = Callable[[str], None]


@dataclass(frozen=True)
class QuantizeJob:
    model: str  # alias (minilm, smollm2) or Hugging Face folder
    config: QuantConfig
    out: Path
    texts: tuple[str, ...] = ()  # calibration / training texts; empty: gensim's lee_background
    steps: int = 200  # distillation steps; 0 = post-training quantization (calibration only)
    batch_size: int = 16
    seq_len: int = 64
    calib_batches: int = 8
    lr: float = 1e-5
    scale_lr: float = 1e-3
    checkpoint_dir: Path | None = None
    seed: int = 0
    smooth_alpha: float | None = None  # SmoothQuant-style scaling before W8A8 / FP8 (Llama-family decoders)
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch_size < 1 or self.seq_len < 8 or self.calib_batches < 1:
            raise ConfigError(f"expected steps >= 0, batch_size >= 1, seq_len >= 8, calib_batches >= 1; found "
                              f"{self.steps}, {self.batch_size}, {self.seq_len}, {self.calib_batches}")
        if self.smooth_alpha is not None and not 0.0 <= self.smooth_alpha <= 1.0:
            raise ConfigError(f"smooth_alpha: expected 0 <= alpha <= 1, found {self.smooth_alpha}")
        if not str(self.out).endswith(".onnx"):
            raise ConfigError(f"out: expected a path ending in .onnx, found {self.out}")


def training_examples(tokenizer, texts: list[str], kind: str, seq_len: int):
    """Equal-length examples: sentences padded to seq_len (encoders), token chunks (decoders)."""
    import torch

    from edgeattn.quantize import data
    from edgeattn.quantize.fidelity import token_chunks

    if kind == "decoder":
        ids = token_chunks(tokenizer, texts, seq_len)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    enc = tokenizer(data.sentences(texts) or texts, padding="max_length", truncation=True, max_length=seq_len,
                    return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def prepare(job: QuantizeJob, progress: Progress = lambda m: None):
    """Load and check everything; returns (float model, tokenizer, kind, examples). No training yet."""
    from edgeattn import hf_models
    from edgeattn.errors import InputError
    from edgeattn.quantize import data
    from edgeattn.quantize.api import check_config

    texts = list(job.texts) or data.lee_documents()
    model, tok, kind = hf_models.load(job.model)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    check_config(model, job.config)
    examples = training_examples(tok, texts, kind, job.seq_len)
    n = examples["input_ids"].shape[0]
    need = max(job.batch_size if job.steps else 1, 1)
    if n < need:
        raise InputError(f"calibration text: expected at least {need} sequences of {job.seq_len} tokens, "
                         f"found {n}; give more text or a smaller --seq-len / batch")
    progress(f"{job.model}: {kind}, {n} training sequences of {job.seq_len} tokens")
    return model, tok, kind, examples


@dataclass
class QuantizeResult:
    section: dict  # what was done, for a manifest or a report
    model: object  # the trained fake-quant model (torch)
    teacher: object  # the float model
    tokenizer: object
    kind: str


def run_quantize(job: QuantizeJob, progress: Progress = lambda m: None) -> QuantizeResult:
    """prepare -> quantize_ -> calibrate -> distill -> export_qdq. Returns a manifest-style section."""
    from edgeattn.quantize.api import calibrate, quantize_
    from edgeattn.quantize.distillation import DistillConfig, distill, init_distributed
    from edgeattn.quantize.qdq_export import export_qdq

    model, tok, kind, examples = prepare(job, progress)
    rank, _ = init_distributed()  # under torchrun: one process group, rank 0 exports
    teacher = copy.deepcopy(model)
    calib = [{k: v[i:i + job.batch_size] for k, v in examples.items()}
             for i in range(0, min(examples["input_ids"].shape[0], job.calib_batches * job.batch_size), job.batch_size)]
    smoothing = None
    if job.smooth_alpha is not None:
        from edgeattn.quantize.smoothing import SmoothConfig, smooth_

        smoothing = smooth_(model, calib, SmoothConfig(alpha=job.smooth_alpha)).as_dict()
        progress(f"smoothing (alpha {job.smooth_alpha}): {len(smoothing['smoothed'])} layers, "
                 f"{len(smoothing['skipped'])} without a scalable producer")
    report = quantize_(model, job.config)
    calibrate(model, calib)
    progress(f"calibrated {len(report.quantized)} layers on {len(calib)} batches")
    losses = distill(model, teacher, examples, kind,
                     DistillConfig(steps=job.steps, batch_size=job.batch_size, lr=job.lr, scale_lr=job.scale_lr,
                                   checkpoint_dir=job.checkpoint_dir, seed=job.seed)) if job.steps else []
    summary = {}
    if rank == 0:
        summary = export_qdq(model, kind, job.out)
        progress(f"wrote {job.out}: {summary['quantized_matmuls']} quantized MatMuls")
    section = {"config": config_to_dict(job.config), "layers": report.as_dict(), "steps": job.steps,
               "smoothing": smoothing,
               "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
               "onnx": summary}
    return QuantizeResult(section, model, teacher, tok, kind)
