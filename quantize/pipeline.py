"""The whole QAT job: Hugging Face model + text -> calibrated, distilled, Q/DQ ONNX, with its fidelity.

Every input is checked before any training starts: config, block size against every Linear,
calibration text, model folder and weights, and that a fidelity floor fits the model's kind."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from edgeattn import hf_models, text
from edgeattn.decoder.export import DecoderExportConfig
from edgeattn.decoder.families import why_not
from edgeattn.errors import ConfigError, InputError
from edgeattn.quantize.config import QuantConfig, config_to_dict
from edgeattn.quantize.distillation import DistillConfig, distill, init_distributed
from edgeattn.quantize.fidelity import Probe, check_floor_kind, check_floor_values

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
    min_cosine: float | None = None  # encoders: fail below this mean embedding cosine on held-out text
    max_ppl_increase: float | None = None  # decoders: fail above this perplexity increase, in percent
    decoder: bool = False  # export a decoder for generation (the KV cache as inputs/outputs, edgeattn.decoder)
    sinks: int = 4  # decoder: first tokens kept for the whole stream
    window_max: int = 2048  # decoder: the ring's default size
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch_size < 1 or self.seq_len < 8 or self.calib_batches < 1:
            raise ConfigError(f"expected steps >= 0, batch_size >= 1, seq_len >= 8, calib_batches >= 1; found "
                              f"{self.steps}, {self.batch_size}, {self.seq_len}, {self.calib_batches}")
        if self.smooth_alpha is not None and not 0.0 <= self.smooth_alpha <= 1.0:
            raise ConfigError(f"smooth_alpha: expected 0 <= alpha <= 1, found {self.smooth_alpha}")
        if not str(self.out).endswith(".onnx"):
            raise ConfigError(f"out: expected a path ending in .onnx, found {self.out}")
        check_floor_values(self.min_cosine, self.max_ppl_increase)


def prepare(job: QuantizeJob, progress: Progress = lambda m: None):
    """Load and check everything; returns (float model, tokenizer, kind, examples). No training yet."""
    from edgeattn.quantize.api import check_config  # loads torch

    texts = list(job.texts) or text.lee_documents()
    model, tok, kind = hf_models.load(job.model)
    check_floor_kind(kind, job.min_cosine, job.max_ppl_increase)
    check_config(model, job.config)
    examples = text.padded_examples(tok, texts, kind, job.seq_len)
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
    """prepare -> quantize_ -> calibrate -> distill -> fidelity -> export_qdq. Returns a manifest-style section.

    Raises FidelityError (nothing written) when the result is below the job's floor."""
    from edgeattn.quantize.api import calibrate, quantize_  # loads torch
    from edgeattn.quantize.qdq_export import export_qdq

    model, tok, kind, examples = prepare(job, progress)
    rank, _ = init_distributed()  # under torchrun: one process group, rank 0 measures and exports
    probe = Probe.measure(model, tok, kind) if rank == 0 else None
    teacher = copy.deepcopy(model)
    calib = text.leading_batches(examples, job.batch_size, job.calib_batches)
    smoothing = None
    if job.smooth_alpha is not None:
        from edgeattn.quantize.smoothing import SmoothConfig, smooth_

        smoothing = smooth_(model, calib, SmoothConfig(alpha=job.smooth_alpha)).as_dict()
        progress(f"smoothing (alpha {job.smooth_alpha}): {len(smoothing['smoothed'])} layers, "
                 f"{len(smoothing['skipped'])} without a scalable producer")
    report = quantize_(model, job.config)
    calibrate(model, calib)
    progress(f"calibrated {len(report.quantized)} layers on {len(calib)} batches")
    losses = []
    if job.steps:
        cfg = DistillConfig(steps=job.steps, lr=job.lr, scale_lr=job.scale_lr, checkpoint_dir=job.checkpoint_dir,
                            seed=job.seed, progress=False)  # the steps go to `progress` (StepProgress)
        losses = distill(model, teacher, text.sampled_batches(examples, job.batch_size, job.seed), kind, cfg,
                         log=progress, task="QAT").losses
    section = {"config": config_to_dict(job.config), "layers": report.as_dict(), "steps": job.steps,
               "smoothing": smoothing,
               "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
               "fidelity": None, "onnx": {}}
    if rank == 0:
        model.cpu()
        section["fidelity"] = probe.check(model, "quantize", job.min_cosine, job.max_ppl_increase, progress)
        if job.decoder:
            if (reason := why_not(model.config)) is not None:
                raise ConfigError(f"decoder: {reason} ({job.model})")
            from edgeattn.quantize.decoder_qdq import export_decoder_qdq  # loads torch

            section["onnx"] = export_decoder_qdq(model, tok, job.out, DecoderExportConfig(sinks=job.sinks,
                                                                                        window_max=job.window_max))
        else:
            section["onnx"] = export_qdq(model, kind, job.out)
        progress(f"wrote {job.out}: {section['onnx']['quantized_matmuls']} quantized MatMuls")
    return QuantizeResult(section, model, teacher, tok, kind)
