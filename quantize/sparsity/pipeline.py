"""`edgeattn sparsify`: HF model -> 2:4 pruned (where it pays), fine-tuned with masks -> ONNX + manifest.

The exported ONNX carries the pruned layer names in its metadata (`edgeattn.sparse_layers`), so
`edgeattn check-sparsity` and the build's check-sparsity pass know which weights must be 2:4. A JSON
manifest section is written beside it (`OUT.sparsity.json`).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import onnx
import onnx_ir as ir

from edgeattn import atomic, hf_models, text
from edgeattn.errors import ConfigError
from edgeattn.export import ExportConfig, export_module
from edgeattn.gpu import check_device_name, resolve_device
from edgeattn.passes.check_sparsity import DECISIONS_KEY, METADATA_KEY, WEIGHTS_KEY, sparse_metadata
from edgeattn.quantize.config import config_from_name
from edgeattn.quantize.distillation import DistillConfig, distill, sparsity_finetune
from edgeattn.quantize.fidelity import Probe, check_floor_kind, check_floor_values, describe
from edgeattn.quantize.sparsity.masks import SparsityConfig, sparsify_
from edgeattn.quantize.sparsity.qat import qat_after_sparsity
from edgeattn.quantize.sparsity.two_four import strip_masks

SIDECAR_SUFFIX = ".sparsity.json"


@dataclass(frozen=True)
class SparsifyJob:
    sparsity: SparsityConfig = SparsityConfig()
    finetune_steps: int = 0  # distillation steps with the masks on (edgeattn.quantize.distillation)
    lr: float = 1e-4
    batch: int = 16
    seq_len: int = 128  # tokens per fine-tuning window (decoders), longest sentence (encoders)
    length_grouping: int = 16  # encoders: batches cut from a pool of this many, sorted by length (1: random)
    time_budget_s: float | None = None  # stop fine-tuning after this many seconds; the lr decays over them
    bf16: bool = False  # bf16 autocast in fine-tuning (CUDA)
    cosine_weight: float = 1.0  # encoders: weight of 1 - pooled cosine next to the hidden-state MSE
    train_embeddings: bool = False
    seed: int = 0
    calib: str | None = None  # text file, one document a line; None = gensim's lee_background
    calib_batches: int = 8  # batches for calibrated masks
    save_hf: str | None = None  # also save the pruned checkpoint (for `edgeattn quantize`, which keeps the zeros)
    export: dict[str, Any] = field(default_factory=dict)  # ExportConfig fields
    qat: str | None = None  # then QAT with edgeattn.quantize (a registered config name), masks kept; Q/DQ export
    qat_steps: int = 0
    device: str = "cpu"  # where pruning and fine-tuning run (cpu, cuda, cuda:N); export runs on the CPU
    min_cosine: float | None = None  # encoders: fail below this mean embedding cosine on held-out text
    max_ppl_increase: float | None = None  # decoders: fail above this perplexity increase, in percent

    def __post_init__(self) -> None:
        check_device_name(self.device)
        if self.calib_batches < 1:
            raise ConfigError(f"calib_batches: expected >= 1, found {self.calib_batches}")
        if self.qat_steps < 0:
            raise ConfigError(f"qat_steps: expected >= 0, found {self.qat_steps}")
        if self.batch < 1 or self.seq_len < 8 or self.length_grouping < 1:
            raise ConfigError(f"batch/seq_len/length_grouping: expected >= 1, >= 8, >= 1, found "
                              f"{self.batch}/{self.seq_len}/{self.length_grouping}")
        if self.qat is not None:
            config_from_name(self.qat)  # an unknown name fails here, before any work
        self.finetune_config("encoder")  # validates steps, lr, time budget, cosine weight
        check_floor_values(self.min_cosine, self.max_ppl_increase)

    def finetune_config(self, kind: str) -> DistillConfig:
        """The distillation settings of the fine-tune with the masks on, for a model of `kind`."""
        return sparsity_finetune(kind, steps=self.finetune_steps, lr=self.lr, time_budget_s=self.time_budget_s,
                                 bf16=self.bf16, train_embeddings=self.train_embeddings, seed=self.seed,
                                 device=self.device, output_weight=1.0 if kind == "decoder" else self.cosine_weight)

    def batching(self) -> dict[str, int]:
        return {"batch_size": self.batch, "seq_len": self.seq_len, "length_grouping": self.length_grouping,
                "seed": self.seed}


def add_sparse_metadata(onnx_path: Path, layers: list[str], decisions: dict[str, dict] | None = None) -> None:
    """Record the pruned layers the graph holds, with digests of their weights (so the build finds them again
    when attention fusion packs them under a new name), and the per-layer decisions in the ONNX metadata,
    atomically."""
    model = onnx.load(str(onnx_path))
    kept = [p for p in model.metadata_props if p.key not in (METADATA_KEY, DECISIONS_KEY, WEIGHTS_KEY)]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    for key, value in sparse_metadata(ir.serde.deserialize_model(model), layers).items():
        model.metadata_props.add(key=key, value=value)
    if decisions:
        model.metadata_props.add(key=DECISIONS_KEY, value=json.dumps(decisions))
    atomic.write_bytes(onnx_path, model.SerializeToString())


def decisions_of(report) -> dict[str, dict]:
    """Compact per-layer decisions for the ONNX metadata (and so for the build manifest)."""
    return {d.name: {"pruned": d.pruned, "basis": d.basis, "reason": d.reason} for d in report.layers}


def export_masked(model, kind: str, out: Path, layers: list[str], export: dict[str, Any],
                  decisions: dict[str, dict] | None = None) -> Path:
    """Export a copy whose masks are baked in (the constants are the masked weights)."""
    path = export_module(strip_masks(model), kind, out, ExportConfig(**export))
    add_sparse_metadata(path, layers, decisions)
    return path


def export_sparse_qdq(student, kind: str, out: str | Path, pruned: list[str],
                      decisions: dict[str, dict] | None = None) -> dict[str, Any]:
    """Export the QAT model as Q/DQ ONNX (masks baked in) and record the pruned layers in its metadata."""
    from edgeattn.quantize.qdq_export import export_qdq  # loads torch

    summary = export_qdq(strip_masks(student), kind, out)
    add_sparse_metadata(Path(out), pruned, decisions)
    return summary


def run_sparsify(model_name: str, out: str | Path, job: SparsifyJob = SparsifyJob(),
                 progress: Callable[[str], None] = lambda msg: None) -> dict[str, Any]:
    """Load, prune, fine-tune, (QAT), measure fidelity, export; returns the manifest section (also written
    beside `out`). Raises FidelityError, and writes nothing, when the result is below the job's floor."""
    out = Path(out)
    resolve_device(job.device)  # a CUDA device that is not there fails before any loading
    model, tok, kind = hf_models.load(model_name)
    check_floor_kind(kind, job.min_cosine, job.max_ppl_increase)
    probe = Probe.measure(model, tok, kind)  # the float reference on held-out text
    teacher = copy.deepcopy(model) if job.finetune_steps or job.qat else None
    calibration = None
    calibrated = job.sparsity.method in ("calibrated", "sequential")
    if calibrated or job.finetune_steps or job.qat:
        texts = text.read_texts(job.calib)
    if calibrated:  # batches of 8, grouped like the fine-tune's
        batches = text.stream_batches(tok, texts, kind, batch_size=8, seq_len=job.seq_len, seed=1,
                                      length_grouping=job.length_grouping)
        calibration = [next(batches) for _ in range(job.calib_batches)]
    for m in (model, teacher):
        if m is not None:
            m.to(job.device)
    progress(f"pruning ({job.sparsity.policy}, {job.sparsity.method}) on {job.device}")
    report = sparsify_(model, job.sparsity, calibration=calibration, progress=progress)
    section: dict[str, Any] = {"model": str(model_name), "kind": kind, "sparsity": report.as_dict(),
                               "basis": sorted({d.basis for d in report.layers if d.pruned or d.basis != "not eligible"}),
                               "calib": job.calib or "gensim lee_background"}
    if job.finetune_steps and report.pruned:
        progress(f"fine-tuning {job.finetune_steps} steps with the masks on")
        cfg = job.finetune_config(kind)
        result = distill(model, teacher, text.stream_batches(tok, texts, kind, **job.batching()), kind, cfg,
                         log=progress, task="fine-tuning")
        section["finetune"] = {**result.section(cfg), "config": {**cfg.as_dict(), **job.batching()}}
    model.cpu()  # export, saving and QAT calibration run on the CPU (QAT's distillation picks CUDA itself)
    if teacher is not None:
        teacher.cpu()
    pruned_hf = strip_masks(model) if job.save_hf else None  # saved once the fidelity check has passed
    if job.qat:
        section["fidelity_before_qat"] = probe.compare(model)
        progress(f"fidelity after 2:4: {describe(section['fidelity_before_qat'])}")
        progress(f"QAT {job.qat}, {job.qat_steps} steps, masks kept")
        section["qat"] = qat_after_sparsity(model, teacher, tok, kind, texts, job.qat_steps,
                                            config=config_from_name(job.qat), progress=progress)
        model.cpu()
    section["fidelity"] = probe.check(model, "sparsify", job.min_cosine, job.max_ppl_increase, progress)
    if pruned_hf is not None:
        with atomic.directory(Path(job.save_hf)) as staging:
            pruned_hf.save_pretrained(staging)
            tok.save_pretrained(staging)
        section["saved_hf"] = str(job.save_hf)
    progress(f"exporting {out}")
    if job.qat:
        section["qdq"] = export_sparse_qdq(model, kind, out, report.pruned, decisions_of(report))
    else:
        export_masked(model, kind, out, report.pruned, job.export, decisions_of(report))
    section["onnx"] = str(out)
    section["job"] = {"finetune": {**job.finetune_config(kind).as_dict(), **job.batching()},
                      "calib_batches": job.calib_batches, "device": job.device}
    atomic.write_text(out.with_name(out.name + SIDECAR_SUFFIX), json.dumps(section, indent=1))
    return section
